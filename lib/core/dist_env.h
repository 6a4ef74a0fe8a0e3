// Where this process sits in a multi-process job, read from the launcher's environment:
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE), SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_JOB_NODELIST, SLURM_JOB_ID), or a single process.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace vlm {

struct DistEnv {
  std::string launcher = "single";  // "torchrun", "slurm" or "single"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_store = false;  // torchrun --no-python: the agent already hosts the TCP store
};

// `env` maps variable names to values (tests pass their own; main passes the process env).
// Throws UsageError for inconsistent values (RANK >= WORLD_SIZE, non-numbers, ...).
DistEnv detect_dist_env(const std::map<std::string, std::string>& env);
DistEnv detect_dist_env_from_process();

// Gradients are all-reduced in buckets of about this many bytes (runtime/distributed.h); the
// memory model replays the same bucketing (memory/step_peaks.h).
inline constexpr int64_t kGradientBucketBytes = 25 * 1024 * 1024;

// The CPU threads this rank may use when train.threads is 0, and where the figure comes from:
// the SLURM task's allocation (SLURM_CPUS_PER_TASK, or SRUN_CPUS_PER_TASK), at most the
// `affinity_cpus` this process may run on (sched_getaffinity: cgroup and taskset limits), else
// those; divided evenly among torchrun's ranks on the node (LOCAL_WORLD_SIZE > 1), which share
// one task's allocation. srun with one task per GPU sets no LOCAL_WORLD_SIZE.
struct CpuShare {
  int threads = 1;
  std::string source;  // for the log: "SLURM_CPUS_PER_TASK=8", "16 cores / LOCAL_WORLD_SIZE=4"
};
CpuShare cpu_share(const std::map<std::string, std::string>& env, int affinity_cpus);
CpuShare cpu_share_from_process();
int affinity_cpu_count();  // sched_getaffinity's count; hardware_concurrency where unavailable

// First host of a SLURM node list: "gpu[003-005,007],cpu01" -> "gpu003".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace vlm
