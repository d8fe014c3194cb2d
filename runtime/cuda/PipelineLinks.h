// Pipeline-parallel messages between stages over NCCL. NCCL matches sends and receives by
// order, not by tag, and a send completes only once the peer receives it; the CPU backend's
// Gloo messages are tagged and buffered, and the plans rely on the latter (a 1F1B stage sends
// its next activation before it receives the gradient its peer sends first). So, on the GPU:
//  - one two-rank communicator per direction of each pair of stages that exchange messages
//    (src -> dst), each driven by one CUDA stream on either side: a link's sends are ordered
//    among themselves, its receives among themselves, and nothing else queues behind them;
//  - messages go through slots of dedicated buffers, as many as the link ever has in flight
//    (loomc check measures it executing the step; the plan's pipeline_links), reused in turn: a
//    send copies the tensor into its slot (once the slot's previous message has left) and the
//    program goes on; a receive is posted into its slot and the program copies out when it has
//    arrived.
// Deadlock freedom then rests on the schedule being valid with buffered sends, which the
// compiler's schedule simulator checks, and on both ends ordering a link's messages alike: the
// k-th send over a link must be the peer's k-th receive over it. The plans carry each
// message's tag (the CPU backend's matching key); linkMessageOrder lists a rank's sequence per
// link, and tests/cuda/pipeline_links_test checks that sender and receiver sequences agree on
// compiled GPipe, 1F1B and interleaved plans. At most one message per link per program.
// Each link exchanges one float right after its communicator is made, so NCCL's lazy
// connection set-up happens there and not in the middle of a step.
// Memory: each link holds its slots x its largest message (the memory plan's pipeline slots).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/cuda/DeviceArray.h"
#include "support/Status.h"
#include "runtime/control/CoordinatorClient.h"

namespace loom::cuda {

class NcclGroup;

class PipelineLinks {
 public:
  // What one direction of one link carries in a step (from the rank's schedule and programs).
  struct Need {
    int peer;         // position in the pp group
    bool send;        // this rank sends (else receives)
    int64_t bytes;    // the largest message
    int messages;     // messages per step
    int slots = 0;    // slots reused in turn (the plan's pipeline_links: the most in flight); 0: one per message
  };
  // `members`: the global ranks of this rank's pp group, `position` its place there. Links are
  // created in one global order (source rank, then destination rank), so no two ranks wait on
  // each other's second link; their NCCL ids go through the coordinator.
  static Status create(control::CoordinatorClient *client, const std::vector<int> &members, int position,
                       const std::vector<Need> &needs, int64_t timeoutMs, std::unique_ptr<PipelineLinks> *out);
  ~PipelineLinks();
  PipelineLinks(const PipelineLinks &) = delete;
  PipelineLinks &operator=(const PipelineLinks &) = delete;

  // Sends `count` elements at `data` (of its type: a 16-bit plan's messages are 16-bit) to
  // `peer` once the work queued on `stream` is done; `stream` itself does not wait for the peer.
  Status send(int peer, In data, int64_t count, cudaStream_t stream);
  // Receives from `peer` into `data`; the work queued on `stream` after this waits for it.
  Status recv(int peer, Out data, int64_t count, cudaStream_t stream);
  // A new step: slots are taken from the first again (every message of the previous step was
  // sent or received by then: the step's schedule ran to its end).
  void startStep();

 private:
  struct Link;
  PipelineLinks() = default;
  Status find(int peer, bool send, Link **out);
  std::vector<std::unique_ptr<Link>> links_;
};

// The links a rank's step uses: its schedule's programs' send and receive instructions counted
// per peer and direction, with the largest message of each. A program with two messages over
// one link (whose order NCCL could not tell apart) is refused.
Status pipelineNeeds(const plan::RankPlan &plan, const plan::ProgramSet &programs,
                     std::vector<PipelineLinks::Need> *out);

// Per (peer, send?) of this rank, the tags of a step's messages over that link in the order
// they go out or are posted: the CPU backend's tag (the instruction's plus the micro-batch's
// channel, as the step driver numbers them: kTagsPerMicroBatch in runtime/Executor.h).
std::map<std::pair<int, bool>, std::vector<int64_t>> linkMessageOrder(const plan::RankPlan &plan,
                                                                      const plan::ProgramSet &programs);

}  // namespace loom::cuda
