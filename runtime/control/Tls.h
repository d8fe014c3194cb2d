// TLS for the control plane: the coordinator's certificate and key, the CA that signs the
// peers' certificates, and the gRPC credentials built from them. With a CA, the coordinator
// also requires and verifies a client certificate (mutual TLS), so only holders of a key
// signed by the job's CA can even present the job token.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "support/Status.h"

namespace loom::control {

struct TlsFiles {
  std::string cert, key, ca;  // PEM file paths; all empty: no TLS
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

struct TlsMaterial {
  std::string certPem, keyPem, caPem;
  bool enabled() const { return !caPem.empty() || !certPem.empty(); }
};

// Reads the files (a missing, empty or non-PEM one is an error naming it); a certificate
// needs its key and the other way round.
Status loadTls(const TlsFiles &files, TlsMaterial *material);

// The coordinator's credentials: insecure without TLS material; with a CA, client
// certificates are required and verified.
std::shared_ptr<grpc::ServerCredentials> serverCredentials(const TlsMaterial &material);
// A rank's (or the launcher's) credentials: insecure without TLS material; the CA verifies
// the coordinator's certificate, the certificate and key (if given) identify this client.
std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const TlsMaterial &material);

// A throwaway self-signed certificate (EC P-256, valid for a day, for 127.0.0.1 and
// localhost) and its key in `dir` (the key readable by its owner only). A local job uses it
// as the coordinator's certificate, every client's certificate and the CA at once.
Status createThrowawayCertificate(const std::string &dir, TlsFiles *files);

// 127.0.0.0/8, ::1 and localhost: addresses no other machine can reach.
bool isLoopback(const std::string &host);

// gRPC's own log lines (a failed handshake, a refused connection) off: the control plane's
// callers report every failure as one line of their own, naming the peer.
void silenceGrpcLogging();

// Equality in time that depends only on the lengths (the job token check).
bool constantTimeEquals(const std::string &a, const std::string &b);

}  // namespace loom::control
