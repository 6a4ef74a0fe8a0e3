// The config schema: loading, every error path with its location, overrides, presets,
// printing and the round trip, the schema listing.
#include <catch2/catch.hpp>

#include "core/config_io.h"
#include "support/test_support.h"

using vlm::ConfigError;
using vlm::load_config;
using vlm::test::TempDir;
using vlm::test::write_file;

namespace {

// The message of the ConfigError that loading `yaml` (written to a file) throws.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  TempDir dir;
  const std::string path = write_file(dir / "c.yaml", yaml);
  try {
    load_config(path, overrides);
  } catch (const ConfigError& e) {
    std::string message = e.what();
    const auto at = message.find(path);
    if (at != std::string::npos) message.replace(at, path.size(), "FILE");
    return message;
  }
  return "no error";
}

}  // namespace

TEST_CASE("defaults load without a file and validate") {
  const auto loaded = load_config("");
  CHECK(loaded.config.model.dims.preset == "tiny");
  CHECK(loaded.config.train.batch_size == 4);
  CHECK(loaded.warnings.empty());
}

TEST_CASE("a file overrides defaults and records where each key was set") {
  TempDir dir;
  const auto path = write_file(dir / "c.yaml",
                               "train:\n"
                               "  batch_size: 8\n"
                               "  lr:\n"
                               "    vision: 1.5e-4\n"
                               "memory:\n"
                               "  simulate_device_bytes: 512MiB\n");
  const auto loaded = load_config(path);
  CHECK(loaded.config.train.batch_size == 8);
  CHECK(loaded.config.train.lr.vision == Approx(1.5e-4));
  CHECK(loaded.config.train.lr.projector == Approx(2e-3));  // untouched default
  CHECK(loaded.config.memory.simulate_device_bytes.bytes == 512ll << 20);
  CHECK(loaded.where("train.batch_size").str() == path + ":2:15");
  CHECK(loaded.where("train.max_steps").str() == path);
}

TEST_CASE("unknown keys name file:line and the closest valid key") {
  CHECK(error_of("train:\n  batchsize: 4\n") ==
        "FILE:2:3: unknown key 'train.batchsize' (did you mean 'train.batch_size'?)");
  CHECK(error_of("trian:\n  batch_size: 4\n") ==
        "FILE:1:1: unknown key 'trian' (did you mean 'train'?)");
  const std::string far = error_of("train:\n  zzzzzzzzzzzzzzzz: 1\n");
  CHECK(far.find("valid keys here: batch_size") != std::string::npos);
}

TEST_CASE("wrong types and out-of-range values name the value and the allowed range") {
  CHECK(error_of("train:\n  batch_size: 0\n") ==
        "FILE:2:15: train.batch_size: 0 is out of range: allowed auto or [1, 65536]");
  CHECK(error_of("train:\n  batch_size: -3\n") ==
        "FILE:2:15: train.batch_size: -3 is out of range: allowed auto or [1, 65536]");
  CHECK(error_of("train:\n  batch_size: four\n") ==
        "FILE:2:15: train.batch_size: expected an integer or auto, got 'four'");
  CHECK(error_of("train:\n  batch_size: 2.5\n") ==
        "FILE:2:15: train.batch_size: expected an integer or auto, got '2.5'");
  CHECK(error_of("train:\n  grad_clip: fast\n") ==
        "FILE:2:14: train.grad_clip: expected a number, got 'fast'");
  CHECK(error_of("train:\n  precision: bf61\n") ==
        "FILE:2:14: train.precision: 'bf61' is not allowed: one of: bf16, fp16, fp32 "
        "(did you mean 'bf16'?)");
  CHECK(error_of("model:\n  checkpoint_vision: maybe\n") ==
        "FILE:2:22: model.checkpoint_vision: expected true or false, got 'maybe'");
  CHECK(error_of("train:\n  batch_size: [1, 2]\n") ==
        "FILE:2:15: train.batch_size: expected an integer or auto, got a list");
  CHECK(error_of("train: 5\n") == "FILE:1:8: train: expected a mapping of keys (a section)");
  CHECK(error_of("memory:\n  simulate_device_bytes: lots\n").find("expected a byte size such as") !=
        std::string::npos);
  CHECK(error_of("train:\n  lr:\n    vision: 0\n") == "no error");  // frozen by lr 0 is legal
  CHECK(error_of("train:\n  adam_eps: 0\n") ==
        "FILE:2:13: train.adam_eps: 0 is out of range: allowed (0, 1]");
}

TEST_CASE("malformed files give one clear line with the location") {
  CHECK(error_of("") == "FILE: config file is empty");
  CHECK(error_of("# only a comment\n") == "FILE: config file is empty");
  CHECK(error_of("train:\n\tbatch_size: 4\n") ==
        "FILE:2:1: tab character in indentation; YAML indents with spaces only");
  CHECK(error_of("train: [1, 2\n").rfind("FILE:2:1: invalid YAML:", 0) == 0);
  CHECK(error_of("- a\n- b\n") ==
        "FILE:1:1: the top level must be a mapping of sections (model:, data:, train:, ...)");
  CHECK(error_of("train:\n  batch_size: 1\n  batch_size: 2\n") ==
        "FILE:3:3: duplicate key 'train.batch_size' (first at line 2)");
  CHECK(error_of(std::string(200, '[') + std::string(200, ']')) ==
        "FILE:1: nesting deeper than 64 levels");
  CHECK_THROWS_WITH(load_config("/no/such/file.yaml"), "/no/such/file.yaml: config file not found");
}

TEST_CASE("a YAML alias bomb is rejected quickly instead of expanding") {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  const char* names = "abcdefghij";
  for (int i = 1; i < 10; ++i) {
    bomb += std::string(1, names[i]) + ": &" + names[i] + " [";
    for (int j = 0; j < 10; ++j) bomb += std::string(j ? ", " : "") + "*" + names[i - 1];
    bomb += "]\n";
  }
  CHECK(error_of(bomb).find("alias/anchor bomb") != std::string::npos);
}

TEST_CASE("a YAML alias that refers to its own anchor is an error, in a file and in --set") {
  // yaml-cpp makes these nodes that contain themselves; every walk would recurse forever.
  CHECK(error_of("model: &a\n  preset: tiny\n  x: *a\n").find("its own anchor") !=
        std::string::npos);
  CHECK(error_of("a: &a [*a]\n").find("its own anchor") != std::string::npos);
  CHECK(error_of("train:\n  batch_size: 1\n", {"train.lr=&a {x: *a}"}).find("its own anchor") !=
        std::string::npos);
}

TEST_CASE("a file of two YAML documents is an error at the second, not half read") {
  CHECK(error_of("train:\n  batch_size: 2\n---\ntrain:\n  batch_size: 99\n") ==
        "FILE:3:1: the text holds more than one YAML document (separated by '---'); a config is "
        "one document");
  CHECK(error_of("---\ntrain:\n  batch_size: 2\n") == "no error");  // one document, marked
}

TEST_CASE("a config that is not UTF-8 is an error at the first bad byte, not an internal error") {
  // fuzz/corpus/config/invalid_utf8_path: the string reached the config hash, whose JSON
  // printing threw nlohmann's type_error (exit 1).
  CHECK(error_of("data:\n  train:\n    - path: data/\xff.jsonl\n") ==
        "FILE:3:18: not valid UTF-8 (byte 0xFF); YAML text must be UTF-8");
  CHECK(error_of("output:\n  dir: \xc3\x28\n") ==
        "FILE:2:8: not valid UTF-8 (byte 0xC3); YAML text must be UTF-8");
  CHECK(error_of("output:\n  dir: \xed\xa0\x80\n").find("byte 0xED") != std::string::npos);
  CHECK(error_of("output:\n  dir: runs/\xc3\xa9t\xc3\xa9 \xf0\x9f\x8c\x8d\n") == "no error");
  CHECK(error_of("train:\n  batch_size: 2\n", {"output.dir=\xfe"}).find("not valid UTF-8") !=
        std::string::npos);
}

TEST_CASE("a stray ',' at the top level is invalid YAML, in a file and in --set, not a hang") {
  // yaml-cpp 0.7's LoadAll loops forever on these (fuzz/corpus/config/stray_comma_*).
  const std::string message = "invalid YAML: a character that cannot start a value here";
  CHECK(error_of(",").find("FILE:1:1: " + message) == 0);
  CHECK(error_of("# a comment\n,# another").find("FILE:2:1: " + message) == 0);
  CHECK(error_of("train:\n  batch_size: 2\n", {"train.batch_size=,"}).find(message) !=
        std::string::npos);
}

TEST_CASE("image normalisation must divide by a real std") {
  CHECK(error_of("data:\n  image_std: [1.0e-30, 0.5, 0.5]\n")
            .find("data.image_std values must be at least 0.001") != std::string::npos);
  CHECK(error_of("data:\n  image_std: [0.5, .nan, 0.5]\n").find("data.image_std") !=
        std::string::npos);
}

TEST_CASE("overrides (--set) apply in order, parse YAML and validate like the file") {
  TempDir dir;
  const auto path = write_file(dir / "c.yaml", "train:\n  batch_size: 8\n");
  const auto loaded = load_config(
      path, {"train.batch_size=2", "train.batch_size=3", "data.image_mean=[0.1, 0.2, 0.3]",
             "data.train=[{path: a.jsonl, weight: 2}, {path: b.jsonl}]", "model.weights="});
  CHECK(loaded.config.train.batch_size == 3);
  CHECK(loaded.config.data.image_mean == std::vector<double>{0.1, 0.2, 0.3});
  REQUIRE(loaded.config.data.train.size() == 2);
  CHECK(loaded.config.data.train[0].weight == 2.0);
  CHECK(loaded.config.data.train[1].path == "b.jsonl");
  CHECK(loaded.where("train.batch_size").str() == "--set train.batch_size=3");

  CHECK(error_of("{}", {"train.batch_size=0"}) ==
        "--set train.batch_size=0: train.batch_size: 0 is out of range: allowed auto or [1, 65536]");
  CHECK(error_of("{}", {"train.bach_size=2"}) ==
        "--set train.bach_size=2: unknown key 'train.bach_size' (did you mean "
        "'train.batch_size'?)");
  CHECK(error_of("{}", {"train.batch_size"}) ==
        "--set train.batch_size: expected KEY=VALUE such as train.batch_size=8");
  CHECK(error_of("{}", {"train..x=1"}) == "--set train..x=1: malformed key 'train..x'");
}

TEST_CASE("a preset sets every dimension, explicit dims of the same source win") {
  TempDir dir;
  const auto path = write_file(dir / "c.yaml",
                               "model:\n  preset: nanovlm-460m\n  language:\n    num_layers: 2\n"
                               "data:\n  max_img_size: 2048\n");
  const auto loaded = load_config(path);
  CHECK(loaded.config.model.dims.language.hidden_size == 960);
  CHECK(loaded.config.model.dims.language.num_layers == 2);
  CHECK(loaded.config.model.dims.vision.image_size == 512);
  const auto again = load_config(path, {"model.preset=tiny"});
  CHECK(again.config.model.dims.language.hidden_size == 128);
  CHECK(error_of("model:\n  preset: huge\n").find("'huge' is not allowed") != std::string::npos);
}

TEST_CASE("cross-field checks: errors at the offending key, warnings with the reachable value") {
  CHECK(error_of("data:\n  max_img_size: 1000\n") ==
        "FILE:2:17: data.max_img_size = 1000 must be a multiple of the crop size "
        "model.vision.image_size = 64");
  CHECK(error_of("model:\n  language:\n    num_kv_heads: 3\n")
            .rfind("FILE:3:19: model.language.num_heads (4) is not a multiple of "
                   "model.language.num_kv_heads (3)",
                   0) == 0);
  CHECK(error_of("model:\n  vision:\n    patch_size: 7\n")
            .rfind("FILE:3:17: model.vision.image_size (64) is not a multiple of "
                   "model.vision.patch_size (7)",
                   0) == 0);
  CHECK(error_of("packing:\n  max_seq_len: 9000\n") ==
        "FILE:2:16: packing.max_seq_len = 9000 exceeds model.language.max_position = 4096");
  CHECK(error_of("data:\n  image_std: [0.5, 0.5]\n") ==
        "FILE:2:14: data.image_std needs 3 values (R, G, B), got 2");
  CHECK(error_of("memory:\n  device_memory: H10-80GB\n") ==
        "FILE:2:18: memory.device_memory = 'H10-80GB' is neither auto, a size (\"80GiB\") nor "
        "a known GPU (did you mean 'H100-80GB'?)");
  CHECK(error_of("memory:\n  device_memory: 80GiB\n") == "no error");
  CHECK(error_of("memory:\n  device_memory: A100-80GB\n") == "no error");
  // A name is looked up exactly (canonical or alias, any case): containment of an alias
  // ("a100", "h100") is only for device names as CUDA reports them.
  CHECK(error_of("memory:\n  device_memory: a100-80gb\n") == "no error");
  CHECK(error_of("memory:\n  device_memory: nvidia h100 80gb hbm3\n") == "no error");
  CHECK(error_of("memory:\n  device_memory: H100\n") == "no error");
  CHECK(error_of("memory:\n  device_memory: A100-80G\n") ==
        "FILE:2:18: memory.device_memory = 'A100-80G' is neither auto, a size (\"80GiB\") nor "
        "a known GPU (did you mean 'A100-80GB'?)");
  CHECK(error_of("memory:\n  device_memory: H100-999GB\n")
            .rfind("FILE:2:18: memory.device_memory = 'H100-999GB' is neither auto, a size", 0) ==
        0);
  CHECK(error_of("memory:\n  device_memory: my A100 box\n")
            .rfind("FILE:2:18: memory.device_memory = 'my A100 box' is neither auto", 0) == 0);

  TempDir dir;
  // nanoVLM's defaults: 18 images per row, but every image costs >= 325 of 4096 tokens.
  const auto path = write_file(dir / "n.yaml",
                               "model:\n  preset: nanovlm-460m\n"
                               "data:\n  max_img_size: 2048\n  resize_to_max: true\n"
                               "packing:\n  max_images_per_knapsack: 18\n");
  const auto loaded = load_config(path);
  REQUIRE(loaded.warnings.size() == 1);
  CHECK(loaded.warnings[0] ==
        path +
            ":7:28: packing.max_images_per_knapsack = 18 can never be reached: the cheapest "
            "image costs 325 tokens (1x4 crops + global at max_img_size 2048), so at most 12 "
            "images fit in packing.max_seq_len = 4096");
}

TEST_CASE("print then load gives the same config (YAML with and without docs)") {
  TempDir dir;
  const auto path = write_file(dir / "c.yaml",
                               "model:\n  preset: nanovlm-222m\n  weights: \"w: x.safetensors\"\n"
                               "data:\n  max_img_size: 896\n"
                               "  train:\n    - path: a.jsonl\n      weight: 0.25\n"
                               "    - path: b.jsonl\n      format: llava\n"
                               "train:\n  lr:\n    vision: 0.1\n  seed: 12345\n"
                               "memory:\n  simulate_device_bytes: 1GiB\n");
  const auto original = load_config(path);
  for (const bool docs : {false, true}) {
    const std::string printed = vlm::to_yaml(original.config, docs);
    const auto reloaded = load_config(write_file(dir / "printed.yaml", printed));
    CHECK(vlm::to_yaml(reloaded.config, false) == vlm::to_yaml(original.config, false));
    CHECK(vlm::to_json(reloaded.config) == vlm::to_json(original.config));
    CHECK(vlm::config_hash(reloaded.config) == vlm::config_hash(original.config));
  }
  CHECK(vlm::config_hash(original.config) != vlm::config_hash(vlm::load_config("").config));
}

TEST_CASE("the schema lists every key with type, default and doc") {
  const auto schema = vlm::config_schema();
  auto find = [&](const std::string& key) -> const vlm::SchemaEntry* {
    for (const auto& e : schema) {
      if (e.key == key) return &e;
    }
    return nullptr;
  };
  for (const char* key : {"train.batch_size",
                          "train.gradient_accumulation_steps",
                          "packing.max_images_per_knapsack",
                          "data.max_images_per_example",
                          "data.max_img_size",
                          "model.vision.image_size",
                          "packing.max_seq_len",
                          "data.max_sample_length",
                          "train.lr.projector",
                          "train.lr.vision",
                          "train.lr.language",
                          "train.warmup_steps",
                          "train.schedule",
                          "train.max_steps",
                          "train.grad_clip",
                          "train.precision",
                          "model.checkpoint_vision",
                          "model.checkpoint_language",
                          "model.freeze_vision",
                          "model.freeze_projector",
                          "model.freeze_language",
                          "memory.device_memory",
                          "memory.safety_margin",
                          "train.seed",
                          "output.dir",
                          "data.train[].path",
                          "log.level",
                          "distributed.backend"}) {
    INFO(key);
    const auto* e = find(key);
    REQUIRE(e != nullptr);
    CHECK_FALSE(e->doc.empty());
    CHECK_FALSE(e->type.empty());
  }
  CHECK(find("train.batch_size")->default_value == "4");
  CHECK(find("train.batch_size")->allowed == "auto or [1, 65536]");
  CHECK(find("train.precision")->type == "enum");
  CHECK(find("train.precision")->allowed == "one of: bf16, fp16, fp32");
}

TEST_CASE("memory.calibration: a path, empty by default, from a file or --set") {
  CHECK(load_config("").config.memory.calibration.empty());
  TempDir dir;
  const auto path = write_file(dir / "c.yaml", "memory:\n  calibration: cal/h100.json\n");
  const auto loaded = load_config(path);
  CHECK(loaded.config.memory.calibration == "cal/h100.json");
  CHECK(loaded.where("memory.calibration").str() == path + ":2:16");
  CHECK(load_config(path, {"memory.calibration=other.json"}).config.memory.calibration ==
        "other.json");
  CHECK(error_of("memory:\n  calibration: [a, b]\n").find("FILE:2:16: memory.calibration") == 0);
}

TEST_CASE("train.batch_size auto: read, printed and checked against global_batch_size") {
  TempDir dir;
  const auto path = write_file(dir / "c.yaml",
                               "train:\n  batch_size: auto\n  global_batch_size: 32\n");
  const auto loaded = load_config(path);
  CHECK(loaded.config.train.batch_size_auto());
  CHECK(loaded.config.train.rows_by_limits() == 1);
  CHECK(loaded.config.train.global_batch_size == 32);
  const std::string printed = vlm::to_yaml(loaded.config, false);
  CHECK(printed.find("batch_size: auto") != std::string::npos);
  CHECK(vlm::to_json(loaded.config)["train"]["batch_size"] == "auto");
  const auto reloaded = load_config(write_file(dir / "printed.yaml", printed));
  CHECK(vlm::config_hash(reloaded.config) == vlm::config_hash(loaded.config));

  CHECK(error_of("train:\n  batch_size: auto\n") ==
        "FILE:2:15: train.batch_size auto needs train.global_batch_size: the packs of one "
        "optimizer step over all ranks (the micro-batches are then sized by memory)");
  CHECK(error_of("train:\n  batch_size: auto\n  global_batch_size: 8\n"
                 "  gradient_accumulation_steps: 4\n")
            .find("FILE:4:32: train.gradient_accumulation_steps = 4 does not apply") == 0);
  CHECK(error_of("train:\n  batch_size: 2\n  global_batch_size: 8\n")
            .find("FILE:3:22: train.global_batch_size is for train.batch_size auto") == 0);
  CHECK(error_of("train:\n  batch_size: Auto\n") ==
        "FILE:2:15: train.batch_size: expected an integer or auto, got 'Auto'");
}

// A step holds at most 65,536 packs (core/config.h): a plan of more took minutes to an hour.
TEST_CASE("a step of more packs than the limit is refused at the key that makes it") {
  CHECK(error_of("train:\n  batch_size: 256\n  gradient_accumulation_steps: 512\n") ==
        "FILE:3:32: train.batch_size x train.gradient_accumulation_steps = 256 x 512 packs a "
        "step on each rank, more than the 65536 packs a step may hold (docs/limits.md)");
  CHECK(error_of("train:\n  batch_size: 256\n  gradient_accumulation_steps: 256\n") == "no error");
  CHECK(error_of("train:\n  batch_size: auto\n  global_batch_size: 16777216\n")
            .find("FILE:3:22: train.global_batch_size") == 0);
  CHECK(error_of("train:\n  batch_size: auto\n  global_batch_size: 65536\n") == "no error");
}
