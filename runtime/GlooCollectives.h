// Collectives over Gloo (TCP) between rank processes: one Gloo context per group of the
// rank's plan (tp, pp, dp, embedding), connected through the coordinator's store.
// Sends never block (they complete in the background and are flushed at the end of a step),
// so a pipeline schedule never deadlocks on a rendezvous between two sends.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"
#include "gloo/transport/device.h"
#include "protos/plan.pb.h"
#include "runtime/Collectives.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace loom {

class GlooCollectives : public Collectives {
 public:
  // Connects every group of size > 1; blocks until the group's peers have connected too.
  static Status create(const plan::RankPlan &plan, gloo::rendezvous::Store &store, const std::string &hostAddress,
                       double timeoutSeconds, std::unique_ptr<GlooCollectives> *out);
  ~GlooCollectives() override;

  int rankIn(const std::string &group) const override;
  int sizeOf(const std::string &group) const override;
  using Collectives::allGather;
  using Collectives::allReduce;
  using Collectives::reduceScatter;
  Status allReduce(const std::string &group, void *data, int64_t n, plan::DType dtype, ReduceOp op) override;
  Status allGather(const std::string &group, const void *in, void *out, int64_t n, plan::DType dtype) override;
  Status reduceScatter(const std::string &group, const void *in, void *out, int64_t n, plan::DType dtype) override;
  Status sendBytes(const std::string &group, int peer, const void *data, int64_t bytes, int tag) override;
  Status recvBytes(const std::string &group, int peer, void *data, int64_t bytes, int tag) override;
  Status flush() override;
  Status exchangeBytes(const std::string &group, int sendPeer, const void *send, int recvPeer, void *recv,
                       int64_t bytes, int tag) override;

 private:
  struct Group {
    std::vector<int> ranks;
    int position = 0;
    std::shared_ptr<gloo::Context> context;  // null for a group of one
    uint32_t nextTag = 1;
  };
  struct PendingSend {
    std::vector<char> data;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    std::string group;
  };
  Status groupOf(const std::string &name, Group **g);

  std::map<std::string, Group> groups_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::vector<std::unique_ptr<PendingSend>> pending_;
  double timeoutSeconds_ = 60;
};

}  // namespace loom
