#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "runtime/distributed_backends.h"

namespace vlm::runtime::detail {

namespace {

// torch.distributed's env:// rendezvous under an agent store (torch/distributed/rendezvous.py).
std::string agent_store_prefix() {
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return std::string("/worker/attempt_") + (attempt != nullptr && *attempt ? attempt : "0");
}

}  // namespace

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

std::string error_text(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : error.what();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

c10::intrusive_ptr<c10d::Store> make_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = false;  // the backend's rendezvous waits for the peers, with a timeout
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    const std::string role = options.isServer ? "host" : "reach";
    throw Error(ExitCode::kTrainingFailed,
                "rank " + std::to_string(env.rank) + " could not " + role +
                    " the rendezvous store at " + where + " within " + seconds_text(timeout) +
                    " (" + error_text(e) + "). Check MASTER_ADDR/MASTER_PORT on every rank, that " +
                    "the port is free on the master and reachable from this node.");
  }
  if (env.agent_store) store = c10::make_intrusive<c10d::PrefixStore>(agent_store_prefix(), store);
  return store;
}

}  // namespace vlm::runtime::detail
