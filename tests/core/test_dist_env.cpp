#include <catch2/catch.hpp>

#include "core/dist_env.h"
#include "core/error.h"

using vlm::detect_dist_env;

TEST_CASE("no launcher variables: a single process") {
  const auto d = detect_dist_env({});
  CHECK(d.launcher == "single");
  CHECK(d.world_size == 1);
  CHECK(d.rank == 0);
}

TEST_CASE("torchrun variables, including the agent-hosted store") {
  const auto d = detect_dist_env({{"RANK", "3"},
                                  {"WORLD_SIZE", "8"},
                                  {"LOCAL_RANK", "1"},
                                  {"MASTER_ADDR", "node7"},
                                  {"MASTER_PORT", "29400"},
                                  {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  CHECK(d.launcher == "torchrun");
  CHECK(d.rank == 3);
  CHECK(d.world_size == 8);
  CHECK(d.local_rank == 1);
  CHECK(d.master_addr == "node7");
  CHECK(d.master_port == 29400);
  CHECK(d.agent_store);
}

TEST_CASE("SLURM variables: master from the node list, port from the job id") {
  const auto d = detect_dist_env({{"SLURM_PROCID", "5"},
                                  {"SLURM_NTASKS", "16"},
                                  {"SLURM_LOCALID", "1"},
                                  {"SLURM_JOB_NODELIST", "gpu[012-015,020]"},
                                  {"SLURM_JOB_ID", "123456"}});
  CHECK(d.launcher == "slurm");
  CHECK(d.rank == 5);
  CHECK(d.world_size == 16);
  CHECK(d.local_rank == 1);
  CHECK(d.master_addr == "gpu012");
  CHECK(d.master_port == 15000 + 123456 % 20000);
  CHECK(vlm::first_slurm_host("a01,a02") == "a01");
  CHECK(vlm::first_slurm_host("single") == "single");
}

TEST_CASE("inconsistent launcher variables are usage errors") {
  CHECK_THROWS_AS(detect_dist_env({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), vlm::UsageError);
  CHECK_THROWS_AS(detect_dist_env({{"RANK", "x"}, {"WORLD_SIZE", "4"}}), vlm::UsageError);
}

TEST_CASE("threads per rank follow the scheduler's CPU allocation") {
  using Env = std::map<std::string, std::string>;
  // SLURM: the task's CPUs, never more than the process may run on.
  CHECK(vlm::cpu_share(Env{{"SLURM_CPUS_PER_TASK", "8"}}, 64).threads == 8);
  CHECK(vlm::cpu_share(Env{{"SLURM_CPUS_PER_TASK", "8"}}, 4).threads == 4);
  CHECK(vlm::cpu_share(Env{{"SRUN_CPUS_PER_TASK", "6"}}, 64).threads == 6);
  CHECK(vlm::cpu_share(Env{{"SLURM_CPUS_PER_TASK", "8"}}, 64).source == "SLURM_CPUS_PER_TASK=8");
  // torchrun: the cores shared by the node's ranks; inside a SLURM task, its allocation.
  CHECK(vlm::cpu_share(Env{{"LOCAL_WORLD_SIZE", "4"}}, 64).threads == 16);
  CHECK(vlm::cpu_share(Env{{"LOCAL_WORLD_SIZE", "8"}}, 4).threads == 1);
  const auto torchrun_in_slurm =
      vlm::cpu_share(Env{{"LOCAL_WORLD_SIZE", "8"}, {"SLURM_CPUS_PER_TASK", "96"}}, 128);
  CHECK(torchrun_in_slurm.threads == 12);
  CHECK(torchrun_in_slurm.source == "SLURM_CPUS_PER_TASK=96 / LOCAL_WORLD_SIZE=8");
  CHECK(vlm::cpu_share(Env{}, 12).threads == 12);
  CHECK(vlm::cpu_share(Env{}, 0).threads == 1);
  CHECK_THROWS_WITH(vlm::cpu_share(Env{{"SLURM_CPUS_PER_TASK", "eight"}}, 8),
                    Catch::Contains("SLURM_CPUS_PER_TASK='eight'"));
  CHECK(vlm::affinity_cpu_count() >= 1);
}
