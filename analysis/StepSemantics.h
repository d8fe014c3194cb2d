// The plan's execution semantics, once, for everything that executes plans symbolically:
// `loomc check` (compiler/PlanCheck.cpp: untimed, proves the ranks can run the step together)
// and `loomc simulate` (compiler/StepSimulator.cpp: the same execution in time, on the cost
// model). It holds each executed rank's schedule as program runs, and for the current run
// which instructions are done and which is running on each stream; it decides when an
// instruction may start (the previous one on its stream has finished, its wait_for events
// are done, last_micro_batch instructions only in the program's last run: passed over
// otherwise), which communicator a collective enters and its call number there (collectives
// are matched by order per communicator, as NCCL and Gloo match them), a message's peer and tag
// (its micro-batch's channel), and buffers each link's messages in order. What an
// instruction does and how long it takes is the driver's: `Driver::issue` is called when one
// may start, and the driver calls `complete` when it has finished (at once, or later in time).
//
// The runtime's executors follow the same rules (runtime/Executor.cpp: a thread per stream
// running its instructions in order, waiting on events; the schedule's programs in order).
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "analysis/PlanCheck.h"
#include "llvm/Support/Error.h"
#include "protos/plan.pb.h"

namespace loom {

class StepSemantics {
 public:
  class Driver {
   public:
    virtual ~Driver() = default;
    // Instruction i of rank r's current run may start. True: it started (it runs until the
    // driver calls complete(r, i), which it may do from here); false: it cannot start yet (a
    // receive whose message has not come): the stream stays on it and it is offered again at
    // the rank's next start().
    virtual llvm::Expected<bool> issue(int r, int i) = 0;
    // A last_micro_batch instruction passed over in an earlier run (done at once).
    virtual void passedOver(int r, int i) {}
    // Instruction i has finished (before it is marked done).
    virtual void completed(int r, int i) {}
    // A program run begins (also for a run of no instructions) or has ended.
    virtual void runBegan(int r) {}
    virtual void runEnded(int r) {}
  };

  // A message in flight on a link (sending rank -> receiving rank), as the drivers track it.
  struct Message {
    int64_t tag = 0, elements = 0;
    plan::DType dtype = plan::F32;
    std::string from;             // where it was sent, for errors
    double sent = 0, arrival = 0;  // in time (the simulator's)
  };
  // A member's entry into a collective call: rank and instruction.
  struct Entry {
    int rank, index;
  };
  // A collective call on a communicator: (communicator, call number there).
  using CallKey = std::pair<int, int64_t>;

  // `executed[r]`: whether rank r is executed (the others are represented by those that are:
  // representativeRanks()).
  StepSemantics(const std::vector<RankPrograms> &ranks, std::vector<bool> executed, Driver &driver);

  // Rank r's schedule as program runs and its groups' communicators; begins its first run.
  llvm::Error prepare(int r);
  // Starts the instructions of rank r that may start now, stream by stream in one pass (and
  // on into the next run when the pass ends one); `untilStable`: passes again while any
  // started (the simulator: everything that can start at this time). True if any started.
  llvm::Expected<bool> start(int r, bool untilStable);
  // Instruction i of rank r's current run has finished: its stream is free; the run ends
  // when every instruction is done, and the next one begins.
  void complete(int r, int i);

  bool finished(int r) const { return state_[size_t(r)].cur >= state_[size_t(r)].runs.size(); }
  bool executed(int r) const { return executed_[size_t(r)]; }
  int ranks() const { return int(ranks_.size()); }
  const ProgramRun &run(int r) const { return state_[size_t(r)].runs[state_[size_t(r)].cur]; }
  const plan::Program &program(int r) const { return *run(r).prog; }
  const plan::Instruction &instruction(int r, int i) const { return program(r).instructions(i); }
  bool done(int r, int i) const { return state_[size_t(r)].done[size_t(i)] != 0; }
  int64_t instructionsRun() const { return completed_; }

  // Communication, as every backend performs it.
  // The global rank a send or recv of rank r talks to (-1: peer outside its group).
  int peerOf(int r, const plan::Instruction &in) const;
  // Its tag: the plan's, in its micro-batch's channel (runtime/Executor.h kTagsPerMicroBatch).
  int64_t tagOf(int r, const plan::Instruction &in) const;
  // The members of rank r's group `group` (global ranks, in group order).
  const std::vector<int> &members(int r, const std::string &group) const;
  // Rank r enters collective i: its call (communicator and call number) and whether every
  // executed member has now entered it (then entries(key) lists them, in the order they came).
  llvm::Error enterCollective(int r, int i, CallKey *key, bool *complete);
  const std::vector<Entry> &entries(const CallKey &key) const { return calls_.at(key); }
  void forgetCall(const CallKey &key) { calls_.erase(key); }
  // "name:member,member,...": the communicator, for errors.
  const std::string &communicatorName(int id) const { return communicatorNames_[size_t(id)]; }
  // The link from -> to: its messages sent and not yet received, in order.
  std::deque<Message> &link(int from, int to) { return links_[{from, to}]; }
  const std::map<std::pair<int, int>, std::deque<Message>> &links() const { return links_; }

  // "rank R in PROGRAM mb M at instruction I (op@group, layer L)".
  std::string at(int r, int i) const;
  // What a stuck rank waits for: its streams' receives and entered collectives.
  std::string waitingIn(int r) const;

 private:
  struct RankState {
    std::vector<ProgramRun> runs;
    size_t cur = 0;
    std::vector<char> done;
    int next[4] = {};      // per stream: the first instruction not yet started
    int running[4] = {};   // per stream: the instruction started and not finished (-1: none)
    int remaining = 0;
    std::map<std::string, std::vector<int>> groups;  // name -> global ranks
    std::map<std::string, int> communicatorOf;      // group name -> communicator id
    std::map<int, int64_t> calls;                    // communicator -> collectives entered
  };
  void beginRun(int r);

  const std::vector<RankPrograms> &ranks_;
  std::vector<bool> executed_;
  Driver &driver_;
  std::vector<RankState> state_;
  std::map<std::string, int> communicators_;    // "name:members" -> id
  std::vector<std::string> communicatorNames_;  // id -> "name:members"
  std::map<CallKey, std::vector<Entry>> calls_;  // calls some members have entered
  std::map<std::pair<int, int>, std::deque<Message>> links_;
  int64_t completed_ = 0;
};

}  // namespace loom
