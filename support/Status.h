// A small error-as-value type for the runtime (which links neither LLVM nor absl).
#pragma once

#include <string>
#include <utility>

namespace loom {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message), true); }
  bool isOk() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string &message() const { return message_; }

 private:
  Status(std::string m, bool failed) : message_(std::move(m)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

#define LOOM_RETURN_IF_ERROR(expr)        \
  do {                                    \
    ::loom::Status _status = (expr);      \
    if (!_status.isOk()) return _status;  \
  } while (0)

}  // namespace loom
