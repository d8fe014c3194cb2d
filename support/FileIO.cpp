#include "support/FileIO.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace loom {

Status readWholeFile(const std::string &path, const char *what, std::string *bytes, const ByteProgress &progress) {
  auto failed = [&] { return Status::error(path + ": cannot read " + what + ": " + std::strerror(errno)); };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return failed();
  bytes->clear();
  struct stat st;
  int64_t size = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) bytes->reserve(size_t(size = st.st_size));
  char buf[1 << 16];
  while (true) {
    if (progress) progress(int64_t(bytes->size()), size);
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {  // a directory, an I/O error
      Status s = failed();
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    bytes->append(buf, size_t(n));
  }
  ::close(fd);
  if (progress) progress(int64_t(bytes->size()), int64_t(bytes->size()));
  return Status::ok();
}

}  // namespace loom
