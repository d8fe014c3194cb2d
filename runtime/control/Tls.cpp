#include "runtime/control/Tls.h"

#include <grpc/support/log.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <ctime>

#include "support/FileIO.h"

namespace loom::control {

namespace {

Status readPem(const std::string &path, const char *what, std::string *pem) {
  LOOM_RETURN_IF_ERROR(readWholeFile(path, ("the TLS " + std::string(what)).c_str(), pem));
  if (pem->find("-----BEGIN ") == std::string::npos)
    return Status::error(path + ": not a PEM file (expected the TLS " + std::string(what) + ")");
  return Status::ok();
}

}  // namespace

Status loadTls(const TlsFiles &files, TlsMaterial *material) {
  *material = {};
  if (files.cert.empty() != files.key.empty())
    return Status::error("--tls-cert and --tls-key go together (a certificate and its private key)");
  if (!files.cert.empty()) {
    LOOM_RETURN_IF_ERROR(readPem(files.cert, "certificate", &material->certPem));
    LOOM_RETURN_IF_ERROR(readPem(files.key, "private key", &material->keyPem));
  }
  if (!files.ca.empty()) LOOM_RETURN_IF_ERROR(readPem(files.ca, "CA certificate", &material->caPem));
  return Status::ok();
}

std::shared_ptr<grpc::ServerCredentials> serverCredentials(const TlsMaterial &m) {
  if (m.certPem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opt(m.caPem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                        : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  opt.pem_root_certs = m.caPem;
  opt.pem_key_cert_pairs.push_back({m.keyPem, m.certPem});
  return grpc::SslServerCredentials(opt);
}

std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const TlsMaterial &m) {
  if (!m.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opt;
  opt.pem_root_certs = m.caPem;
  opt.pem_private_key = m.keyPem;
  opt.pem_cert_chain = m.certPem;
  return grpc::SslCredentials(opt);
}

Status createThrowawayCertificate(const std::string &dir, TlsFiles *files) {
  EVP_PKEY *key = EVP_EC_gen("P-256");
  X509 *cert = X509_new();
  Status result = Status::ok();
  auto fail = [&](const char *what) { result = Status::error(std::string("cannot create a TLS certificate: ") + what); };
  if (!key || !cert) {
    fail("OpenSSL could not allocate a key");
  } else {
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), long(std::time(nullptr)));
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
    X509_set_pubkey(cert, key);
    X509_NAME *name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char *>("loom local job"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE"},
                              std::pair{NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost"},
                              std::pair{NID_key_usage, "critical,digitalSignature,keyCertSign"}}) {
      X509_EXTENSION *ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      if (!ext || !X509_add_ext(cert, ext, -1)) fail("an extension was refused");
      X509_EXTENSION_free(ext);
    }
    if (result.isOk() && !X509_sign(cert, key, EVP_sha256())) fail("signing failed");
  }
  if (result.isOk()) {
    files->cert = files->ca = dir + "/coordinator.crt";
    files->key = dir + "/coordinator.key";
    FILE *c = std::fopen(files->cert.c_str(), "w");
    mode_t old = umask(077);
    FILE *k = std::fopen(files->key.c_str(), "w");
    umask(old);
    if (!c || !k || !PEM_write_X509(c, cert) || !PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr))
      result = Status::error(dir + ": cannot write the TLS certificate and key");
    if (c) std::fclose(c);
    if (k) std::fclose(k);
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  return result;
}

void silenceGrpcLogging() {
  gpr_set_log_function([](gpr_log_func_args *) {});
}

bool isLoopback(const std::string &host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

bool constantTimeEquals(const std::string &a, const std::string &b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace loom::control
