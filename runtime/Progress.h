// Where a rank is in its step, for its heartbeat: every executed instruction counts, and each
// plan stream's instruction in flight (program, micro-batch, index, op, layer; a collective
// with its group and its call number on that group) is kept. The coordinator reads the reports
// to tell a stalled rank (stuck in its own work) from the ranks waiting for it.
//
// Two ways in: a backend that executes each instruction before going on (the CPU executor)
// reports it started and finished; one that queues instructions to complete later (CUDA
// streams: the host runs ahead of the device, several programs deep) reports each one issued
// with a completion probe. There a stream's first issued instruction not yet complete is in
// flight unless it waits: on an earlier run (a program run's streams start after everything
// the previous run queued) or on an instruction of another stream (its wait_for).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "protos/plan.pb.h"

namespace loom {

// Tells whether an issued instruction has completed (CUDA: an event recorded after it).
// Called with the Progress's lock held, from the reporting thread or the issuing one.
class CompletionProbe {
 public:
  virtual ~CompletionProbe() = default;
  virtual bool done(uint64_t token) = 0;
  virtual void release(uint64_t token) = 0;  // the token will not be asked about again
};

class Progress {
 public:
  // An instruction of `program` (micro-batch mb) starts / ends on its stream.
  void started(const plan::Program &program, int mb, int index);
  void finished(const plan::Program &program, int index);
  // An instruction of program run `run` (numbered by the caller, increasing) queued on its
  // stream; it has completed once probe->done(token).
  void issued(const plan::Program &program, int mb, int index, int64_t run, CompletionProbe *probe, uint64_t token);
  // The probe goes away: its instructions' tokens are released and no longer reported.
  void detach(CompletionProbe *probe);
  // Between programs the rank may still wait on communication outside any instruction (the
  // end of a step waits for its pipeline sends to be delivered): `what` ("" when done).
  void waitingOutside(const std::string &what);
  // Seconds spent so far in instructions reported through started/finished that are not
  // communication (kernels, not collectives or send/recv waits): the rank's own work, which
  // is what tells a slow rank from the ranks waiting for it (the straggler report). -1 when no
  // instruction was timed (a backend that only reports issued instructions: CUDA).
  double computeSeconds();

  struct Report {
    int64_t completed = 0;  // instructions finished since the start
    bool waiting = false;   // every instruction in flight waits on communication
    bool idle = false;      // no instruction in flight (between programs: loading, saving, logging)
    std::string where;      // "backward_1 mb 3 at instruction 41 (linear, layer 7)" or
                            // "all_reduce@tp #212 of backward_1 mb 3"
  };
  Report report();

 private:
  struct InFlight {
    const plan::Program *program = nullptr;
    int mb = -1, index = -1;
    int64_t call = -1;  // a collective's number among its group's calls
    std::chrono::steady_clock::time_point start;
  };
  struct Issued {
    InFlight at;
    int64_t run = 0;
    CompletionProbe *probe = nullptr;
    uint64_t token = 0;
  };
  int64_t callNumber(const plan::Instruction &in);  // with mu_ held
  void reapIssued();                                 // with mu_ held: drops completed instructions
  bool pending(int64_t run, int index) const;        // with mu_ held: issued, not complete

  std::mutex mu_;
  int64_t completed_ = 0;
  InFlight stream_[4];
  std::deque<Issued> issued_[4];          // per stream, in issue order
  std::map<std::string, int64_t> calls_;  // group -> collectives started
  std::string outside_;                   // a wait between programs
  double computeSeconds_ = 0;
  bool timed_ = false;
};

}  // namespace loom
