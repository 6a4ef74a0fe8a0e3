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
