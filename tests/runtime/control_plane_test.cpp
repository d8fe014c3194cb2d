// The control plane's security as real processes: loomrun's local job runs over mutual TLS
// with a throwaway certificate it removes; a TLS coordinator turns away a plaintext client, a
// client without a certificate, a certificate from another CA and a wrong token, each with
// one line naming the coordinator; an address other machines can reach is refused without
// TLS unless --insecure is given.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "runtime/control/Tls.h"
#include "tests/runtime/MultiProcess.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;

std::string tmpdir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

std::string plans() {
  static std::string dir = [] {
    std::string d = tmpdir() + "/plans_control";
    Result r = run(runfile("apps/loomc") + " compile " + runfile("tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt") +
                   " --cluster " + runfile("tests/runtime/Inputs/t1p1d1.pbtxt") + " --out " + d + " --quiet");
    EXPECT_EQ(r.exitCode, 0) << r.output;
    return d;
  }();
  return dir;
}

control::TlsFiles certificate(const std::string &name) {
  std::string dir = tmpdir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  control::TlsFiles f;
  Status s = control::createThrowawayCertificate(dir, &f);
  EXPECT_TRUE(s.isOk()) << s.message();
  return f;
}

// A coordinator in the background; its port once it listens.
struct Coordinator {
  Result result;
  std::thread thread;
  std::string port;
  // The coordinator gives up (and exits) `registrationSeconds` after it starts: long enough
  // for every rank the test starts, each of which may retry for its --connect-timeout.
  Coordinator(const std::string &flags, int registrationSeconds = 6) {
    std::string portFile = tmpdir() + "/control.port";
    std::remove(portFile.c_str());
    thread = std::thread([this, flags, portFile, registrationSeconds] {
      result = run(runfile("apps/loom-coord") + " --plans " + plans() + " --token right --port-file " + portFile +
                   " --registration-timeout " + std::to_string(registrationSeconds) + " " + flags);
    });
    for (int i = 0; i < 100 && port.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream(portFile) >> port;
    }
  }
  ~Coordinator() { thread.join(); }
};

Result rank(const std::string &port, const std::string &flags, const std::string &token = "right") {
  return run("LOOM_TOKEN=" + token + " " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:" + port +
             " --rank 0 --connect-timeout 3 " + flags);
}

std::string tlsFlags(const control::TlsFiles &trust, const control::TlsFiles &identity) {
  return "--tls-ca " + trust.ca + " --tls-cert " + identity.cert + " --tls-key " + identity.key;
}

TEST(ControlPlane, ALocalJobRunsOverMutualTlsAndRemovesItsKey) {
  // The throwaway key lives in loomrun's private directory under $TMPDIR, gone after the job.
  std::string jobTmp = tmpdir() + "/loomrun_tmp";
  fs::remove_all(jobTmp);
  fs::create_directories(jobTmp);
  Result r = run("TMPDIR=" + jobTmp + " " + runfile("apps/loomrun") + " --nproc 1 --plans " + plans() + " --steps 1");
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("(mutual TLS)"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_empty(jobTmp)) << "loomrun left " << fs::directory_iterator(jobTmp)->path();
  Result plain = run(runfile("apps/loomrun") + " --nproc 1 --plans " + plans() + " --steps 1 --insecure");
  ASSERT_EQ(plain.exitCode, 0) << plain.output;
  EXPECT_NE(plain.output.find("(plaintext)"), std::string::npos) << plain.output;
}

TEST(ControlPlane, ThrowawayKeysAreTheOwnersOnly) {
  control::TlsFiles f = certificate("cert_mode");
  struct stat st;
  ASSERT_EQ(stat(f.key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u) << "the private key is readable by others";
  control::TlsMaterial m;
  EXPECT_TRUE(control::loadTls(f, &m).isOk());
  EXPECT_NE(m.keyPem.find("PRIVATE KEY"), std::string::npos);
}

TEST(ControlPlane, ATlsCoordinatorTurnsAwayWhomItShould) {
  control::TlsFiles job = certificate("cert_job"), other = certificate("cert_other");
  // Five refused ranks, three of them retrying for up to 3 s: 6 s was too short on a loaded
  // machine (the last rank found the coordinator gone).
  Coordinator coord(tlsFlags(job, job), 20);
  ASSERT_FALSE(coord.port.empty()) << coord.result.output;
  std::string where = "loom-rank 0: error: cannot reach the coordinator at 127.0.0.1:" + coord.port;

  Result plaintext = rank(coord.port, "");
  EXPECT_NE(plaintext.exitCode, 0);
  EXPECT_NE(plaintext.output.find(where), std::string::npos) << plaintext.output;
  EXPECT_NE(plaintext.output.find("if the coordinator uses TLS, give --tls-ca"), std::string::npos) << plaintext.output;

  Result noCertificate = rank(coord.port, "--tls-ca " + job.ca);
  EXPECT_NE(noCertificate.exitCode, 0);
  EXPECT_NE(noCertificate.output.find("give --tls-cert and --tls-key"), std::string::npos) << noCertificate.output;

  // Trusting another CA: the coordinator's certificate fails verification, and the handshake
  // failure ends the attempt at once (no retries until the timeout).
  Result wrongCa = rank(coord.port, tlsFlags(other, other));
  EXPECT_NE(wrongCa.exitCode, 0);
  EXPECT_NE(wrongCa.output.find("certificate verify failed"), std::string::npos) << wrongCa.output;
  EXPECT_NE(wrongCa.output.find("after 1 attempts"), std::string::npos) << wrongCa.output;

  // The right CA, a client certificate the job's CA did not sign.
  Result foreignClient = rank(coord.port, "--tls-ca " + job.ca + " --tls-cert " + other.cert + " --tls-key " + other.key);
  EXPECT_NE(foreignClient.exitCode, 0);
  EXPECT_NE(foreignClient.output.find(where), std::string::npos) << foreignClient.output;

  Result wrongToken = rank(coord.port, tlsFlags(job, job), "wrong");
  EXPECT_NE(wrongToken.exitCode, 0);
  EXPECT_NE(wrongToken.output.find("refused the job token"), std::string::npos) << wrongToken.output;
  for (const Result *r : {&plaintext, &noCertificate, &wrongCa, &foreignClient, &wrongToken})
    EXPECT_EQ(r->output.find("ssl_transport_security"), std::string::npos) << "gRPC's own log line:\n" << r->output;
}

TEST(ControlPlane, PlaintextOnAReachableAddressNeedsInsecure) {
  Result refused = run(runfile("apps/loom-coord") + " --plans " + plans() + " --token t --bind 0.0.0.0");
  EXPECT_EQ(refused.exitCode, 1);
  EXPECT_NE(refused.output.find("loom-coord: error: refusing to serve the job token in plaintext on 0.0.0.0"),
            std::string::npos)
      << refused.output;
  Coordinator insecure("--bind 0.0.0.0 --insecure --registration-timeout 1");
  EXPECT_FALSE(insecure.port.empty()) << "--insecure did not start the coordinator";
  Result contradiction = run(runfile("apps/loom-coord") + " --plans " + plans() + " --token t --insecure --tls-ca x");
  EXPECT_EQ(contradiction.exitCode, 1);
  EXPECT_NE(contradiction.output.find("--insecure and --tls-* contradict each other"), std::string::npos)
      << contradiction.output;
  Result halfPair = run(runfile("apps/loom-coord") + " --plans " + plans() + " --token t --tls-cert x.pem");
  EXPECT_NE(halfPair.output.find("--tls-cert and --tls-key go together"), std::string::npos) << halfPair.output;
  control::TlsFiles f = certificate("cert_notpem");
  std::ofstream(f.key) << "not a key";
  Result notPem = run(runfile("apps/loom-coord") + " --plans " + plans() + " --token t --tls-cert " + f.cert +
                      " --tls-key " + f.key);
  EXPECT_NE(notPem.output.find(f.key + ": not a PEM file"), std::string::npos) << notPem.output;
}

TEST(ControlPlane, TokensCompareByValue) {
  EXPECT_TRUE(control::constantTimeEquals("abc", "abc"));
  EXPECT_FALSE(control::constantTimeEquals("abc", "abd"));
  EXPECT_FALSE(control::constantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(control::isLoopback("127.0.0.1"));
  EXPECT_TRUE(control::isLoopback("localhost"));
  EXPECT_FALSE(control::isLoopback("0.0.0.0"));
  EXPECT_FALSE(control::isLoopback("10.0.0.1"));
}

}  // namespace
}  // namespace loom::test
