#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/test_support.h"
#include "train/checkpoint_dir.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;
using vlm::test::write_file;
using namespace vlm::train;

namespace {

// Writes a checkpoint of `step` with two files whose content depends on the step.
fs::path save_checkpoint(const fs::path& root, int64_t step) {
  CheckpointWriter writer(root, "hash-1");
  const fs::path tmp = writer.begin(step);
  write_file(tmp / "model.bin", "weights of step " + std::to_string(step));
  write_file(tmp / "rank-1" / "optimizer.bin", std::string(1000, static_cast<char>('a' + step)));
  writer.add_file("model.bin");
  writer.add_file("rank-1/optimizer.bin");
  return writer.commit();
}

std::vector<int64_t> steps_of(const std::vector<CheckpointInfo>& list) {
  std::vector<int64_t> steps;
  for (const auto& info : list) steps.push_back(info.step);
  return steps;
}

void flip_byte(const fs::path& file, std::streamoff offset) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(offset);
  char c = 0;
  io.get(c);
  io.seekp(offset);
  io.put(static_cast<char>(c ^ 0x01));
}

}  // namespace

CATCH_TEST_CASE("file_crc32 is zlib's CRC-32", "[checkpoint]") {
  TempDir dir("ckpt");
  // The standard CRC-32 check value (e.g. the catalogue of parametrised CRC algorithms).
  CATCH_CHECK(file_crc32(write_file(dir / "check.txt", "123456789")) == 0xCBF43926u);
  CATCH_CHECK(file_crc32(write_file(dir / "empty.txt", "")) == 0u);
  CATCH_CHECK_THROWS_AS(file_crc32(dir / "missing"), vlm::Error);
}

CATCH_TEST_CASE("a committed checkpoint is listed with its marker", "[checkpoint]") {
  TempDir out("ckpt");
  const fs::path root = checkpoints_dir(out.path());
  CATCH_CHECK(checkpoint_dir_name(1234) == "step-00001234");
  CATCH_CHECK(list_checkpoints(root).empty());  // no directory yet

  const fs::path committed = save_checkpoint(root, 1234);
  CATCH_CHECK(committed == root / "step-00001234");
  CATCH_CHECK(fs::is_regular_file(committed / kCheckpointMarker));

  const auto list = list_checkpoints(root);
  CATCH_REQUIRE(list.size() == 1);
  CATCH_CHECK(list[0].step == 1234);
  CATCH_CHECK(list[0].config_hash == "hash-1");
  CATCH_CHECK(list[0].created.size() == 20);  // 2026-11-21T10:00:00Z
  CATCH_REQUIRE(list[0].files.count("rank-1/optimizer.bin") == 1);
  CATCH_CHECK(list[0].files.at("rank-1/optimizer.bin").bytes == 1000);
  CATCH_CHECK(list[0].files.at("model.bin").crc32 == file_crc32(committed / "model.bin"));

  // Nothing but the final directory remains.
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(root)) entries += entry.is_directory() ? 1 : 0;
  CATCH_CHECK(entries == 1);
}

CATCH_TEST_CASE("a crash before commit leaves a tmp directory that is ignored", "[checkpoint]") {
  TempDir out("ckpt");
  const fs::path root = checkpoints_dir(out.path());
  save_checkpoint(root, 10);
  // What a process killed between writing files and the rename leaves behind: even a marker.
  const fs::path crashed = root / "step-00000020.tmp-999999999";
  write_file(crashed / "model.bin", "partial");
  write_file(crashed / kCheckpointMarker, R"({"step": 20, "files": {}})");

  CATCH_CHECK(steps_of(list_checkpoints(root)) == std::vector<int64_t>{10});
  CATCH_REQUIRE(newest_valid_checkpoint(root).has_value());
  CATCH_CHECK(newest_valid_checkpoint(root)->step == 10);
}

CATCH_TEST_CASE("damaged checkpoints are skipped and the previous one is chosen", "[checkpoint]") {
  TempDir out("ckpt");
  const fs::path root = checkpoints_dir(out.path());
  save_checkpoint(root, 1);
  const fs::path newest = save_checkpoint(root, 2);
  CATCH_REQUIRE(newest_valid_checkpoint(root)->step == 2);

  CATCH_SECTION("truncated file") { fs::resize_file(newest / "rank-1" / "optimizer.bin", 999); }
  CATCH_SECTION("flipped byte (same size)") {
    flip_byte(newest / "model.bin", 3);
    CATCH_CHECK(list_checkpoints(root, CheckpointVerify::kSizes).size() == 2);  // sizes agree
  }
  CATCH_SECTION("deleted file") { fs::remove(newest / "model.bin"); }
  CATCH_SECTION("deleted marker") { fs::remove(newest / kCheckpointMarker); }
  CATCH_SECTION("garbage marker") { write_file(newest / kCheckpointMarker, "{\"step\": 2, \"fi"); }
  CATCH_SECTION("marker of another step") {
    write_file(newest / kCheckpointMarker, R"({"step": 3, "files": {}})");
  }
  CATCH_SECTION("marker escaping the directory") {
    write_file(newest / kCheckpointMarker,
               R"({"step": 2, "files": {"../x": {"bytes": 0, "crc32": 0}}})");
  }
  // Valid markers otherwise (step and files right): refused before they are parsed.
  CATCH_SECTION("marker larger than 16 MiB") {
    std::string marker = vlm::test::read_file(newest / kCheckpointMarker);
    marker.insert(marker.rfind('}'), ", \"padding\": \"" + std::string(17 << 20, 'x') + "\"");
    write_file(newest / kCheckpointMarker, marker);
  }
  CATCH_SECTION("marker nested 100,000 levels deep") {
    std::string marker = vlm::test::read_file(newest / kCheckpointMarker);
    marker.insert(marker.rfind('}'),
                  ", \"extra\": " + std::string(100000, '[') + std::string(100000, ']'));
    write_file(newest / kCheckpointMarker, marker);
  }
  CATCH_SECTION("marker with a negative size") {
    write_file(newest / kCheckpointMarker,
               R"({"step": 2, "files": {"model.bin": {"bytes": -1, "crc32": 0}}})");
  }

  CATCH_CHECK(steps_of(list_checkpoints(root)) == std::vector<int64_t>{1});
  CATCH_REQUIRE(newest_valid_checkpoint(root).has_value());
  CATCH_CHECK(newest_valid_checkpoint(root)->step == 1);
}

CATCH_TEST_CASE("a checkpoint file written to a full disk is a save failure naming it",
                "[checkpoint]") {
  // /dev/full fails every write with ENOSPC, as a full disk does.
  try {
    write_file_synced("/dev/full", std::string(100000, 'x'));
    CATCH_FAIL("no error");
  } catch (const vlm::Error& e) {
    CATCH_CHECK(e.code() == vlm::ExitCode::kSaveFailed);
    CATCH_CHECK_THAT(e.what(), Catch::Contains("checkpoint: cannot write /dev/full: ") &&
                                   Catch::Contains(std::strerror(ENOSPC)));
  }
  TempDir out("ckpt-full");
  const fs::path file = out / "state.json";
  write_file_synced(file, "{}\n");
  CATCH_CHECK(vlm::test::read_file(file) == "{}\n");
}

CATCH_TEST_CASE("pruning keeps the newest K and removes stale tmp directories", "[checkpoint]") {
  TempDir out("ckpt");
  const fs::path root = checkpoints_dir(out.path());
  for (int64_t step : {100, 200, 300, 400, 500}) save_checkpoint(root, step);
  fs::remove(root / "step-00000200" / kCheckpointMarker);         // incomplete, older than kept
  write_file(root / "step-00000600" / "model.bin", "no marker");  // incomplete, newest
  const fs::path dead_tmp = root / "step-00000700.tmp-999999999";
  const fs::path live_tmp = root / ("step-00000700.tmp-" + std::to_string(::getpid()));
  write_file(dead_tmp / "model.bin", "x");
  write_file(live_tmp / "model.bin", "x");

  const PruneResult result = prune_checkpoints(root, 2);
  CATCH_CHECK(steps_of(result.kept) == std::vector<int64_t>{400, 500});
  CATCH_CHECK(steps_of(list_checkpoints(root)) == std::vector<int64_t>{400, 500});
  CATCH_CHECK_FALSE(fs::exists(root / "step-00000100"));
  CATCH_CHECK_FALSE(fs::exists(root / "step-00000200"));
  CATCH_CHECK_FALSE(fs::exists(root / "step-00000300"));
  CATCH_CHECK_FALSE(fs::exists(dead_tmp));
  CATCH_CHECK(fs::exists(live_tmp));                // its writer (this process) is alive
  CATCH_CHECK(fs::exists(root / "step-00000600"));  // left for inspection
  CATCH_CHECK(result.removed.size() == 4);
  CATCH_CHECK_THROWS(prune_checkpoints(root, 0));
}

CATCH_TEST_CASE("abort and an uncommitted writer leave nothing", "[checkpoint]") {
  TempDir out("ckpt");
  const fs::path root = checkpoints_dir(out.path());
  {
    CheckpointWriter writer(root, "h");
    const fs::path tmp = writer.begin(5);
    write_file(tmp / "model.bin", "x");
    writer.add_file("model.bin");
    writer.abort();
    CATCH_CHECK_FALSE(writer.in_progress());
    CATCH_CHECK_FALSE(fs::exists(tmp));
    write_file(writer.begin(6) / "model.bin", "y");  // destructor aborts this one
  }
  CATCH_CHECK(fs::is_empty(root));
}

CATCH_TEST_CASE("checkpoint writer rejects bad file names and replaces a step", "[checkpoint]") {
  TempDir out("ckpt");
  const fs::path root = checkpoints_dir(out.path());
  CheckpointWriter writer(root, "h");
  CATCH_CHECK_THROWS_AS(writer.add_file("model.bin"), vlm::Error);  // before begin()
  const fs::path tmp = writer.begin(7);
  write_file(tmp / "model.bin", "old");
  CATCH_CHECK_THROWS_AS(writer.add_file("../model.bin"), vlm::Error);
  CATCH_CHECK_THROWS_AS(writer.add_file(kCheckpointMarker), vlm::Error);
  CATCH_CHECK_THROWS_AS(writer.add_file("not-written.bin"), vlm::Error);
  writer.add_file("model.bin");
  writer.commit();

  write_file(writer.begin(7) / "model.bin", "new!");
  writer.add_file("model.bin");
  writer.commit();
  const auto list = list_checkpoints(root);
  CATCH_REQUIRE(list.size() == 1);
  CATCH_CHECK(list[0].files.at("model.bin").bytes == 4);
  CATCH_CHECK(vlm::test::read_file(root / "step-00000007" / "model.bin") == "new!");
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(root)) ++entries;
  CATCH_CHECK(entries == 1);
}
