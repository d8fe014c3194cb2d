// Kernels by declared op (plan/InstructionSet.h), one registry per backend: each backend's
// kernels register themselves next to their code (runtime/cpu/*Kernels.cpp, runtime/cuda/
// DeviceKernels.cpp), the executors dispatch through the registry, and a plan whose op has no
// kernel in a backend is refused when the backend loads it, in one line naming op and backend.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "plan/InstructionSet.h"
#include "protos/plan.pb.h"
#include "support/Status.h"

namespace loom {

// One instruction's operands and attributes, read through its declaration: `in("mask")` is
// the buffer bound to the declared input `mask` (-1 when the optional operand is absent),
// attributes read with their declared defaults.
class KernelCall {
 public:
  KernelCall(const isa::OpDecl &d, const plan::Program &p, const plan::Instruction &i)
      : decl(d), program(p), instruction(i), attrs(d, i) {}
  // Binds the operands to their slots; a one-line error for operands that do not fit the
  // declaration (a corrupt plan).
  Status bind() {
    if (auto e = isa::bindOperands(decl, program, instruction, &bound))
      return Status::error(*e + " (corrupt plan)");
    return Status::ok();
  }
  int in(std::string_view name) const { return bound.inputs[size_t(isa::inputSlot(decl, name))]; }
  int out(std::string_view name) const { return bound.outputs[size_t(isa::outputSlot(decl, name))]; }
  // Buffer shape helpers.
  const plan::Buffer &buffer(int id) const { return program.buffers(id); }
  int64_t numel(int id) const {
    int64_t n = 1;
    for (int64_t d : program.buffers(id).shape()) n *= d;
    return n;
  }
  int64_t dim(int id, int k) const {
    const plan::Buffer &b = program.buffers(id);
    return k < 0 ? b.shape(b.shape_size() + k) : b.shape(k);
  }
  int64_t i64(std::string_view name) const { return attrs.i64(name); }
  double f64(std::string_view name) const { return attrs.f64(name); }
  std::string str(std::string_view name) const { return attrs.str(name); }
  bool flag(std::string_view name) const { return attrs.flag(name); }
  // The rows [begin, end) of `rows` (the flattened leading dimensions) an instruction covers:
  // row_begin / row_end (tp_comm_overlap's chunks of linear and all_reduce), unset: all of
  // them. A one-line error for a range outside them (a corrupt plan).
  Status rowRange(int64_t rows, int64_t *begin, int64_t *end) const {
    *begin = i64("row_begin"), *end = i64("row_end");
    if (*end == 0) *begin = 0, *end = rows;
    if (*begin < 0 || *begin >= *end || *end > rows)
      return Status::error(std::string(decl.name) + ": rows " + std::to_string(*begin) + ".." + std::to_string(*end) +
                           " outside the " + std::to_string(rows) + " rows (corrupt plan)");
    return Status::ok();
  }

  // all_gather / reduce_scatter's row range as whole slices along the dims before `dim`: the
  // slices [begin, end) of `outer` (all of them when unset); `largeRows` are the gathered
  // buffer's flattened rows. A one-line error for a range that cuts a slice (a corrupt plan).
  Status sliceRange(int64_t outer, int64_t largeRows, int64_t *begin, int64_t *end) const {
    int64_t r0, r1;
    LOOM_RETURN_IF_ERROR(rowRange(largeRows, &r0, &r1));
    int64_t per = outer > 0 ? largeRows / outer : 0;
    if (per <= 0 || largeRows % outer != 0 || r0 % per != 0 || r1 % per != 0)
      return Status::error(std::string(decl.name) + ": rows " + std::to_string(r0) + ".." + std::to_string(r1) +
                           " are not whole slices before dim " + std::to_string(i64("dim")) + " (corrupt plan)");
    *begin = r0 / per, *end = r1 / per;
    return Status::ok();
  }

  const isa::OpDecl &decl;
  const plan::Program &program;
  const plan::Instruction &instruction;
  isa::Attrs attrs;
  isa::BoundOperands bound;
};

template <typename Context>
class KernelRegistry {
 public:
  using Kernel = Status (*)(Context &context, const KernelCall &call);
  explicit KernelRegistry(const char *backend) : backend_(backend) {}

  void add(isa::OpId op, Kernel kernel) { kernels_[size_t(op)] = kernel; }
  Kernel find(isa::OpId op) const { return kernels_[size_t(op)]; }
  const char *backend() const { return backend_; }

  // Every instruction of `program` has a declared op with a kernel here.
  Status covers(const plan::Program &program) const {
    for (int i = 0; i < program.instructions_size(); ++i) {
      const std::string &op = program.instructions(i).op();
      const isa::OpDecl *d = isa::find(op);
      if (!d) return Status::error(program.name() + ": instruction " + std::to_string(i) + ": unknown op '" + op + "'");
      if (!find(d->id))
        return Status::error(program.name() + ": instruction " + std::to_string(i) + ": the " + backend_ +
                             " backend has no kernel for op '" + op + "'");
    }
    return Status::ok();
  }

  // Runs `in` with its op's kernel.
  Status run(Context &context, const plan::Program &program, const plan::Instruction &in) const {
    const isa::OpDecl *d = isa::find(in.op());
    if (!d) return Status::error("unknown op '" + in.op() + "'");
    Kernel k = find(d->id);
    if (!k) return Status::error(std::string("the ") + backend_ + " backend has no kernel for op '" + in.op() + "'");
    KernelCall call(*d, program, in);
    LOOM_RETURN_IF_ERROR(call.bind());
    return k(context, call);
  }

 private:
  const char *backend_;
  std::array<Kernel, isa::kOpCount> kernels_{};
};

}  // namespace loom
