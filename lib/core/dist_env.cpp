#include "core/dist_env.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace vlm {
namespace {

int to_int(const std::map<std::string, std::string>& env, const std::string& name, int fallback) {
  const auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return fallback;
  int value = 0;
  const auto& s = it->second;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), value);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || value < 0) {
    throw UsageError("environment variable " + name + "='" + s + "' is not a non-negative integer");
  }
  return value;
}

std::string get(const std::map<std::string, std::string>& env, const std::string& name,
                const std::string& fallback = "") {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // Grammar: host[,host]* where host = prefix[ranges]suffix, ranges = a[-b][,c[-d]]*
  const auto bracket = nodelist.find('[');
  const auto comma = nodelist.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return nodelist.substr(0, comma);
  }
  const std::string prefix = nodelist.substr(0, bracket);
  const auto close = nodelist.find(']', bracket);
  if (close == std::string::npos) throw UsageError("malformed SLURM node list '" + nodelist + "'");
  std::string first = nodelist.substr(bracket + 1, close - bracket - 1);
  first = first.substr(0, first.find_first_of(",-"));
  return prefix + first;
}

DistEnv detect_dist_env(const std::map<std::string, std::string>& env) {
  DistEnv d;
  if (env.count("RANK") && env.count("WORLD_SIZE")) {
    d.launcher = "torchrun";
    d.rank = to_int(env, "RANK", 0);
    d.world_size = to_int(env, "WORLD_SIZE", 1);
    d.local_rank = to_int(env, "LOCAL_RANK", 0);
    d.master_addr = get(env, "MASTER_ADDR", "127.0.0.1");
    d.master_port = to_int(env, "MASTER_PORT", 29500);
    d.agent_store = get(env, "TORCHELASTIC_USE_AGENT_STORE") == "True" ||
                    get(env, "TORCHELASTIC_USE_AGENT_STORE") == "1";
  } else if (env.count("SLURM_PROCID") && env.count("SLURM_NTASKS")) {
    d.launcher = "slurm";
    d.rank = to_int(env, "SLURM_PROCID", 0);
    d.world_size = to_int(env, "SLURM_NTASKS", 1);
    d.local_rank = to_int(env, "SLURM_LOCALID", 0);
    const std::string nodes = get(env, "SLURM_STEP_NODELIST", get(env, "SLURM_JOB_NODELIST"));
    d.master_addr = get(env, "MASTER_ADDR", nodes.empty() ? "127.0.0.1" : first_slurm_host(nodes));
    // A port derived from the job id keeps concurrent jobs on one node apart.
    const int job = to_int(env, "SLURM_JOB_ID", 0);
    d.master_port = to_int(env, "MASTER_PORT", 15000 + job % 20000);
  }
  if (d.world_size < 1) throw UsageError("world size must be at least 1");
  if (d.rank >= d.world_size) {
    throw UsageError("rank " + std::to_string(d.rank) + " is not below the world size " +
                     std::to_string(d.world_size) + " (launcher: " + d.launcher + ")");
  }
  return d;
}

namespace {

std::map<std::string, std::string> process_env() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

}  // namespace

DistEnv detect_dist_env_from_process() { return detect_dist_env(process_env()); }

CpuShare cpu_share(const std::map<std::string, std::string>& env, int affinity_cpus) {
  CpuShare share{std::max(1, affinity_cpus), ""};
  share.source = std::to_string(share.threads) + " cores this process may use";
  for (const char* name : {"SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK"}) {
    const int per_task = to_int(env, name, 0);
    if (per_task > 0) {
      share.threads = std::min(per_task, share.threads);
      share.source = std::string(name) + "=" + std::to_string(per_task);
      break;
    }
  }
  const int local_ranks = to_int(env, "LOCAL_WORLD_SIZE", 0);
  if (local_ranks > 1) {
    share.threads = std::max(1, share.threads / local_ranks);
    share.source += " / LOCAL_WORLD_SIZE=" + std::to_string(local_ranks);
  }
  return share;
}

int affinity_cpu_count() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

CpuShare cpu_share_from_process() { return cpu_share(process_env(), affinity_cpu_count()); }

}  // namespace vlm
