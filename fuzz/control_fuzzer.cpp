// Control-plane requests as a coordinator receives them: a sequence of RPCs (a byte choosing
// the call and whether the job token is right, two bytes of length, the request message) to
// one coordinator of a 4-rank job, each followed by its main loop's poll. Waits are cut to a
// millisecond so that one input runs in microseconds.
#include <grpcpp/test/server_context_test_spouse.h>

#include <algorithm>
#include <filesystem>

#include "fuzz/FuzzSupport.h"
#include "runtime/control/CoordinatorService.h"

namespace {

template <typename Request>
bool parse(const std::string &bytes, Request *req) {
  return req->ParseFromString(bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace loom::control;
  static const std::string planDir = [] {
    std::string d = loom::fuzz::scratchPath("plans");
    std::filesystem::create_directories(d);
    loom::fuzz::writeScratch(d + "/rank_0.plan.pb", std::string("plan bytes"));
    return d;
  }();
  CoordinatorOptions opt{planDir, "the-token", 4, 10, 120};
  CoordinatorService service(opt);
  size_t at = 0;
  for (int calls = 0; calls < 16 && at + 3 <= size; ++calls) {
    uint8_t choice = data[at];
    size_t len = std::min<size_t>(size_t(data[at + 1]) | size_t(data[at + 2]) << 8, size - at - 3);
    std::string bytes(reinterpret_cast<const char *>(data + at + 3), len);
    at += 3 + len;
    grpc::ServerContext ctx;
    grpc::testing::ServerContextTestSpouse spouse(&ctx);
    spouse.AddClientMetadata("loom-token", choice & 0x80 ? "a-wrong-token" : "the-token");
    Empty empty;
    switch (choice % 9) {
      case 0: {
        RegisterRequest req;
        RegisterReply rep;
        if (parse(bytes, &req)) (void)service.Register(&ctx, &req, &rep);
        break;
      }
      case 1: {
        GetFileRequest req;
        GetFileReply rep;
        if (parse(bytes, &req)) (void)service.GetFile(&ctx, &req, &rep);
        break;
      }
      case 2: {
        KvSetRequest req;
        if (parse(bytes, &req)) (void)service.KvSet(&ctx, &req, &empty);
        break;
      }
      case 3: {
        KvGetRequest req;
        KvGetReply rep;
        if (parse(bytes, &req)) {
          req.set_timeout_ms(1);
          (void)service.KvGet(&ctx, &req, &rep);
        }
        break;
      }
      case 4: {
        BarrierRequest req;
        if (parse(bytes, &req)) {
          req.set_timeout_ms(1);
          (void)service.Barrier(&ctx, &req, &empty);
        }
        break;
      }
      case 5: {
        HeartbeatRequest req;
        HeartbeatReply rep;
        if (parse(bytes, &req)) (void)service.Heartbeat(&ctx, &req, &rep);
        break;
      }
      case 6: {
        MetricsRequest req;
        MetricsReply rep;
        if (parse(bytes, &req)) {
          req.set_wait_ms(std::min<int64_t>(req.wait_ms(), 1));
          (void)service.ReportMetrics(&ctx, &req, &rep);
        }
        break;
      }
      case 7: {
        AbortRequest req;
        if (parse(bytes, &req)) (void)service.Abort(&ctx, &req, &empty);
        break;
      }
      default: {
        FinishRequest req;
        if (parse(bytes, &req)) (void)service.Finish(&ctx, &req, &empty);
        break;
      }
    }
    (void)service.poll();
  }
  return 0;
}
