// Gloo (CPU) backend. Debian's TorchConfig does not define USE_C10D_GLOO, without which
// ProcessGroupGloo.hpp declares nothing.
#include <torch/torch.h>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "runtime/distributed_backends.h"

namespace vlm::runtime::detail {

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The network device Gloo binds: GLOO_SOCKET_IFNAME like torch.distributed (its first
// interface), loopback for a single-node job on 127.0.0.1, otherwise the address this host's
// name resolves to (Gloo falls back to loopback if that cannot be bound).
std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname) {
    const std::string first(ifname, std::strcspn(ifname, ","));
    return c10d::ProcessGroupGloo::createDeviceForInterface(first);
  }
  if (is_loopback(env.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

c10::intrusive_ptr<compat::CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, const DistEnv& env,
    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(gloo_device(env));
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, options);
  } catch (const std::exception& e) {
    throw Error(ExitCode::kTrainingFailed,
                "gloo rendezvous failed on rank " + std::to_string(env.rank) + " of " +
                    std::to_string(env.world_size) + " within " + seconds_text(timeout) +
                    ": not every rank joined (" + error_text(e) +
                    "). Check that all ranks started with the same WORLD_SIZE and MASTER_ADDR/" +
                    "MASTER_PORT, and that nodes can reach each other (GLOO_SOCKET_IFNAME).");
  }
}

}  // namespace vlm::runtime::detail
