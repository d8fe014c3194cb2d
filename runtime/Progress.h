// Where a rank is in its step, for its heartbeat: every executed instruction counts, and each
// plan stream's instruction in flight (program, micro-batch, index, op, layer; a collective
// with its group and its call number on that group) is kept. The coordinator reads the reports
// to tell a stalled rank (stuck in its own work) from the ranks waiting for it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "protos/plan.pb.h"

namespace loom {

class Progress {
 public:
  // An instruction of `program` (micro-batch mb) starts / ends on its stream.
  void started(const plan::Program &program, int mb, int index);
  void finished(const plan::Program &program, int index);
  // Between programs the rank may still wait on communication outside any instruction (the
  // end of a step waits for its pipeline sends to be delivered): `what` ("" when done).
  void waitingOutside(const std::string &what);

  struct Report {
    int64_t completed = 0;  // instructions finished since the start
    bool waiting = false;   // every instruction in flight waits on communication
    bool idle = false;      // no instruction in flight (between programs: loading, saving, logging)
    std::string where;      // "backward_1 mb 3 at instruction 41 (linear, layer 7)" or
                            // "all_reduce@tp #212 of backward_1 mb 3"
  };
  Report report() const;

 private:
  struct InFlight {
    const plan::Program *program = nullptr;
    int mb = -1, index = -1;
    int64_t call = -1;  // a collective's number among its group's calls
  };
  mutable std::mutex mu_;
  int64_t completed_ = 0;
  InFlight stream_[4];
  std::map<std::string, int64_t> calls_;  // group -> collectives started
  std::string outside_;                   // a wait between programs
};

}  // namespace loom
