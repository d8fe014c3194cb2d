#include "plan/ProgramCheck.h"

#include "plan/InstructionSet.h"

namespace loom {

Status checkProgramStructure(const plan::Program &prog) {
  for (int i = 0; i < prog.instructions_size(); ++i) {
    const plan::Instruction &in = prog.instructions(i);
    if (in.stream() < plan::COMPUTE || in.stream() > plan::DP)
      return Status::error(prog.name() + ": instruction " + std::to_string(i) + " names an unknown stream");
    for (int w : in.wait_for())
      if (w < 0 || w >= i)
        return Status::error(prog.name() + ": instruction " + std::to_string(i) + " waits on " + std::to_string(w) +
                             " (corrupt plan)");
    for (int b : in.inputs())
      if (b < 0 || b >= prog.buffers_size()) return Status::error(prog.name() + ": buffer id out of range (corrupt plan)");
    for (int b : in.outputs())
      if (b < 0 || b >= prog.buffers_size()) return Status::error(prog.name() + ": buffer id out of range (corrupt plan)");
  }
  for (const plan::Binding &b : prog.arguments())
    if (b.buffer() < 0 || b.buffer() >= prog.buffers_size())
      return Status::error(prog.name() + ": argument buffer id out of range (corrupt plan)");
  // Only inout arguments may be written.
  std::vector<bool> writable(prog.buffers_size(), true);
  for (const plan::Binding &b : prog.arguments()) writable[b.buffer()] = b.inout();
  for (int i = 0; i < prog.instructions_size(); ++i)
    for (int b : prog.instructions(i).outputs())
      if (!writable[b])
        return Status::error(prog.name() + ": instruction " + std::to_string(i) + " writes argument '" +
                             [&] {
                               for (const plan::Binding &a : prog.arguments())
                                 if (a.buffer() == b) return a.name();
                               return std::string();
                             }() +
                             "', which is not inout (corrupt plan)");
  for (const plan::Binding &b : prog.results())
    if (b.buffer() < 0 || b.buffer() >= prog.buffers_size())
      return Status::error(prog.name() + ": result buffer id out of range (corrupt plan)");
  return Status::ok();
}

Status checkProgram(const plan::Program &prog) {
  LOOM_RETURN_IF_ERROR(checkProgramStructure(prog));
  // Every instruction as the instruction set declares it (plan/InstructionSet.h).
  if (auto e = isa::verifyProgram(prog)) return Status::error(*e + " (corrupt plan)");
  return Status::ok();
}

}  // namespace loom
