// WebDataset tar shards (lib/data/source/{tar_reader,tar_index,shard_sample,shard_dataset}):
// the index, the samples, the same data as manifest and files, and every kind of bad shard.
#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config_io.h"
#include "core/error.h"
#include "data/data_setup.h"
#include "data/demo/demo_data.h"
#include "data/image/image_decode.h"
#include "data/image/image_encode.h"
#include "data/source/brace_pattern.h"
#include "data/source/item_source.h"
#include "data/source/manifest.h"
#include "data/source/open_files.h"
#include "data/source/shard_dataset.h"
#include "data/source/tar_index.h"
#include "data/source/tar_reader.h"
#include "data/source/tar_writer.h"
#include "support/test_support.h"

using namespace vlm::data;
using vlm::test::read_file;
using vlm::test::TempDir;
using vlm::test::write_file;
namespace fs = std::filesystem;

namespace {

struct Member {
  std::string name;
  std::string data;
  unsigned type = AE_IFREG;  // AE_IFDIR, AE_IFLNK: written with libarchive directly
};

// A tar in the given libarchive format (ARCHIVE_FORMAT_TAR_USTAR, _PAX_RESTRICTED, _GNUTAR).
std::string write_tar(const fs::path& path, const std::vector<Member>& members,
                      int format = ARCHIVE_FORMAT_TAR_PAX_RESTRICTED) {
  fs::create_directories(path.parent_path());
  archive* a = archive_write_new();
  archive_write_set_format(a, format);
  archive_write_set_bytes_in_last_block(a, 1);
  REQUIRE(archive_write_open_filename(a, path.c_str()) == ARCHIVE_OK);
  for (const Member& m : members) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, m.name.c_str());
    archive_entry_set_filetype(e, m.type);
    archive_entry_set_perm(e, 0644);
    if (m.type == AE_IFLNK) archive_entry_set_symlink(e, m.data.c_str());
    archive_entry_set_size(e, m.type == AE_IFREG ? static_cast<la_int64_t>(m.data.size()) : 0);
    REQUIRE(archive_write_header(a, e) == ARCHIVE_OK);
    if (m.type == AE_IFREG && !m.data.empty()) {
      REQUIRE(archive_write_data(a, m.data.data(), m.data.size()) ==
              static_cast<la_ssize_t>(m.data.size()));
    }
    archive_entry_free(e);
  }
  REQUIRE(archive_write_close(a) == ARCHIVE_OK);
  archive_write_free(a);
  return path.string();
}

std::string png_bytes(int64_t w, int64_t h, uint8_t shade = 90) {
  RgbImage image(w, h);
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    image.pixels[i] = static_cast<uint8_t>(shade + i % 7);
  }
  const std::vector<uint8_t> bytes = encode_png(image);
  return std::string(bytes.begin(), bytes.end());
}

std::string sample_json(const std::string& images = "") {
  return (images.empty() ? std::string("{") : "{\"images\": " + images + ", ") +
         R"("texts": [{"user": "What colour?", "assistant": "red"}]})";
}

std::string read_bytes(const ImageRef& ref) {
  const std::vector<uint8_t> bytes = read_image_bytes(ref);
  return std::string(bytes.begin(), bytes.end());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const vlm::DataError& e) {
    return e.what();
  }
  return "no DataError";
}

const SampleProblem* problem_of(const ParsedLine& parsed) {
  return std::get_if<SampleProblem>(&parsed);
}

}  // namespace

TEST_CASE("brace patterns expand as webdataset's do, and bad ones name the pattern") {
  CHECK(expand_braces("a-{000..003}.tar") ==
        std::vector<std::string>{"a-000.tar", "a-001.tar", "a-002.tar", "a-003.tar"});
  CHECK(expand_braces("{x,y}-{8..10}") ==
        std::vector<std::string>{"x-8", "x-9", "x-10", "y-8", "y-9", "y-10"});
  CHECK(expand_braces("plain.tar") == std::vector<std::string>{"plain.tar"});
  for (const char* bad : {"a-{3..1}.tar", "a-{1..}.tar", "a-{}.tar", "a-{1..2.tar", "a-}{", "a-{x}",
                          "{0..99999999999}", "{a,{b}}"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(expand_braces(bad), vlm::ConfigError);
  }
  CHECK_THROWS_WITH(expand_braces("s-{5..1}.tar"), Catch::Contains("s-{5..1}.tar"));
}

TEST_CASE("a member's key is its path up to the first dot of its basename") {
  CHECK(webdataset_key("a/b.0.jpg") == "a/b");
  CHECK(webdataset_key("x.json") == "x");
  CHECK(webdataset_key("d.v2/x.json") == "d.v2/x");
  CHECK_FALSE(webdataset_key("README"));
  CHECK_FALSE(webdataset_key("dir/.hidden"));
  CHECK_FALSE(webdataset_key("dir.x/noext"));
}

TEST_CASE("the index holds each sample's first header byte and the end, in Energon's layout") {
  TempDir dir;
  const std::string png = png_bytes(20, 10);
  const std::string shard =
      write_tar(dir / "s.tar", {{"a.json", sample_json()},
                                {"a.jpg.png", png},  // suffix "jpg.png": an image member
                                {"b.json", sample_json()},
                                {"c.json", sample_json()},
                                {"c.0.png", png}});
  const ReadOnlyFile file(shard);
  const TarIndex index = scan_tar(file);
  // Headers: a.json 0, a.jpg.png 1024, b.json 1024 + 512 + 512 (padded PNG) ...
  REQUIRE(index.samples() == 3);
  CHECK(index.starts[0] == 0);
  for (const uint64_t s : index.starts) CHECK(s % 512 == 0);
  CHECK(index.starts.back() <= file.size());
  CHECK(index.starts.back() + 1024 == file.size());  // the two end-of-archive records

  const TarIndex loaded = load_tar_index(file);  // builds and writes SHARD.idx
  CHECK(loaded.starts == index.starts);
  const std::string bytes = read_file(tar_index_path_beside(shard));
  REQUIRE(bytes.size() == 8 * 4);
  CHECK(static_cast<unsigned char>(bytes[8]) == (index.starts[1] & 0xff));
  CHECK(static_cast<unsigned char>(bytes[9]) == ((index.starts[1] >> 8) & 0xff));
  CHECK(parse_tar_index(bytes, file.size(), "i", shard).starts == index.starts);

  // An index is read, not rebuilt: one that differs but fits is believed...
  TarIndex other = index;
  other.starts.erase(other.starts.begin() + 1);
  write_file(tar_index_path_beside(shard), serialize_tar_index(other));
  CHECK(load_tar_index(file).samples() == 2);
  // ... unless it is older than its shard.
  const auto now = fs::last_write_time(shard);
  fs::last_write_time(tar_index_path_beside(shard), now - std::chrono::hours(1));
  CHECK(load_tar_index(file).samples() == 3);
  CHECK(read_file(tar_index_path_beside(shard)) == bytes);
}

TEST_CASE("an index that cannot belong to its shard is refused, naming both") {
  TempDir dir;
  const std::string shard = write_tar(dir / "s.tar", {{"a.json", sample_json()}});
  const ReadOnlyFile file(shard);
  for (const std::string& bad :
       {std::string(7, '\0'), serialize_tar_index({{0, 0}}), serialize_tar_index({{0, 100}}),
        serialize_tar_index({{0, 1u << 20}})}) {
    write_file(tar_index_path_beside(shard), bad);
    const std::string message = error_of([&] { load_tar_index(file); });
    CHECK(message.find("s.tar.idx does not fit its shard") != std::string::npos);
    CHECK(message.find("delete the index") != std::string::npos);
  }
  // A layout that fits but whose offsets are not at sample starts: found when read.
  TempDir dir2;
  const std::string two =
      write_tar(dir2 / "t.tar",
                {{"a.json", sample_json()}, {"a.png", png_bytes(4, 4)}, {"b.json", sample_json()}});
  const uint64_t size = fs::file_size(two);
  write_file(tar_index_path_beside(two), serialize_tar_index({{0, 1024, size - 1024}}));
  const ShardDataset dataset(two);
  REQUIRE(dataset.size() == 2);
  const std::string message = error_of([&] { dataset.read(1); });
  CHECK(message.find("t.tar") != std::string::npos);
  CHECK(message.find("does not match the shard's index") != std::string::npos);
}

TEST_CASE("the index goes to the cache folder where it cannot be written beside the shard") {
  TempDir dir;
  TempDir cache;
  ::setenv("VLMTRAIN_CACHE_DIR", cache.path().c_str(), 1);
  const std::string shard = write_tar(dir / "s.tar", {{"a.json", sample_json()}});
  fs::create_directory(tar_index_path_beside(shard));  // the name taken: no file can go there
  const ReadOnlyFile file(shard);
  CHECK(load_tar_index(file).samples() == 1);
  const std::string cached = tar_index_path_in_cache(shard);
  CHECK(cached.rfind(cache.path().string(), 0) == 0);
  CHECK(fs::file_size(cached) == 16);
  CHECK(load_tar_index(file).samples() == 1);  // read from the cache
  ::unsetenv("VLMTRAIN_CACHE_DIR");
}

TEST_CASE("a shard's samples: the JSON in either style, images listed or found by number") {
  TempDir dir;
  const std::string p0 = png_bytes(30, 20, 10), p1 = png_bytes(8, 8, 50), p2 = png_bytes(5, 9, 70);
  const std::vector<uint8_t> webp = encode_webp(RgbImage(12, 6), -1);
  const std::string llava =
      R"({"image": "0.png", "conversations": [{"from": "human", "value": "<image>\nQ"}, {"from": "gpt", "value": "A"}]})";
  const std::string shard = write_tar(
      dir / "s.tar", {{"listed.json", sample_json(R"(["1.png", "listed.0.png"])")},
                      {"listed.0.png", p0},
                      {"listed.1.png", p1},
                      {"listed.txt", "ignored"},
                      {"found.2.png", p2},
                      {"found.json", sample_json()},
                      {"found.png", p0},
                      {"found.10.webp", std::string(webp.begin(), webp.end())},
                      {"found.1.jpg", std::string(p1)},  // a PNG named .jpg: the bytes decide
                      {"llava.json", llava},
                      {"llava.0.png", p1},
                      {"text.json", sample_json()}});
  const ShardDataset dataset(shard);
  REQUIRE(dataset.size() == 4);
  const auto listed = std::get<RawSample>(dataset.read(0));
  CHECK(listed.where.str() == shard + ":listed");
  REQUIRE(listed.images.size() == 2);
  CHECK(listed.images[0].member == "listed.1.png");
  CHECK(listed.images[0].name() == shard + ":listed.1.png");
  CHECK(read_bytes(listed.images[0]) == p1);
  CHECK(read_bytes(listed.images[1]) == p0);
  CHECK(listed.turns.at(1).text == "red");

  const auto found = std::get<RawSample>(dataset.read(1));
  std::vector<std::string> order;
  for (const ImageRef& image : found.images) order.push_back(image.member);
  CHECK(order ==
        std::vector<std::string>{"found.png", "found.1.jpg", "found.2.png", "found.10.webp"});
  CHECK(read_bytes(found.images[3]) == std::string(webp.begin(), webp.end()));
  CHECK(decode_image_bytes(read_image_bytes(found.images[3]), "w").width == 12);
  CHECK(decode_image_bytes(read_image_bytes(found.images[1]), "j").width == 8);

  const auto llava_sample = std::get<RawSample>(dataset.read(2));
  REQUIRE(llava_sample.images.size() == 1);
  CHECK(read_bytes(llava_sample.images[0]) == p1);
  CHECK(std::get<RawSample>(dataset.read(3)).images.empty());
  CHECK(dataset.where(3).str() == shard + ":sample 3");
}

TEST_CASE("PAX and GNU long names are read, their data placed right") {
  TempDir dir;
  const std::string key = "folder/" + std::string(140, 'k');  // beyond ustar's 100 bytes
  const std::string png = png_bytes(9, 9);
  for (const int format :
       {ARCHIVE_FORMAT_TAR_PAX_INTERCHANGE, ARCHIVE_FORMAT_TAR_GNUTAR, ARCHIVE_FORMAT_TAR_USTAR}) {
    CAPTURE(format);
    const std::string k = format == ARCHIVE_FORMAT_TAR_USTAR ? "short" : key;
    const std::string shard = write_tar(
        dir / ("f" + std::to_string(format) + ".tar"),
        {{k + ".json", sample_json()}, {k + ".0.png", png}, {"b.json", sample_json()}}, format);
    const ShardDataset dataset(shard);
    REQUIRE(dataset.size() == 2);
    const auto sample = std::get<RawSample>(dataset.read(0));
    REQUIRE(sample.images.size() == 1);
    CHECK(sample.images[0].member == k + ".0.png");
    CHECK(read_bytes(sample.images[0]) == png);
    CHECK(std::holds_alternative<RawSample>(dataset.read(1)));
  }
}

TEST_CASE("bad members and samples are skipped with a reason, or ignored, never a crash") {
  TempDir dir;
  const std::string png = png_bytes(6, 6);
  const std::string shard =
      write_tar(dir / "s.tar", {{"dir", "", AE_IFDIR},
                                {"README", "no key"},
                                {".hidden", "no key"},
                                {"nojson.png", png},
                                {"missing.json", sample_json(R"(["0.png"])")},
                                {"missing.1.png", png},
                                {"link.json", sample_json(R"(["0.png"])")},
                                {"link.0.png", "missing.1.png", AE_IFLNK},
                                {"broken.json", "{not json"},
                                {"noanswer.json", R"({"texts": [{"user": "q", "assistant": ""}]})"},
                                {"ok.json", sample_json()}});
  const ShardDataset dataset(shard);
  REQUIRE(dataset.size() == 6);
  CHECK(problem_of(dataset.read(0))->reason == "no_json");
  CHECK(problem_of(dataset.read(0))->where.str() == shard + ":nojson");
  CHECK(problem_of(dataset.read(1))->reason == "missing_image");
  CHECK(problem_of(dataset.read(2))->reason == "missing_image");  // a link is no image
  CHECK(problem_of(dataset.read(3))->reason == "malformed_json");
  CHECK(problem_of(dataset.read(3))->where.str() == shard + ":broken.json");
  CHECK(problem_of(dataset.read(4))->reason == "no_assistant_turn");
  CHECK(std::holds_alternative<RawSample>(dataset.read(5)));
}

TEST_CASE("broken shards stop with a data error naming the shard and the member") {
  TempDir dir;
  const std::string png = png_bytes(64, 64);
  const std::string whole = write_tar(
      dir / "whole.tar",
      {{"a.json", sample_json()}, {"a.0.png", png}, {"b.json", sample_json()}, {"b.0.png", png}});
  const std::string bytes = read_file(whole);
  SECTION("truncated inside a member") {
    const std::string cut = write_file(dir / "cut.tar", bytes.substr(0, 1024 + 512 + 100));
    const std::string message = error_of([&] { ShardDataset d(cut); });
    CHECK(message.find("cut.tar") != std::string::npos);
    CHECK(message.find("a.0.png") != std::string::npos);
  }
  SECTION("cut where a member starts, or two shards concatenated") {
    const uint64_t second = scan_tar(ReadOnlyFile(whole)).starts.at(1);
    const std::string cut = write_file(dir / "cut.tar", bytes.substr(0, second));
    CHECK(error_of([&] { ShardDataset d(cut); })
              .find("cut.tar: the archive ends at byte " + std::to_string(second) +
                    " without its two zero end records") != std::string::npos);
    const std::string cat = write_file(dir / "cat.tar", bytes + bytes);
    CHECK(error_of([&] { ShardDataset d(cat); }).find("cat.tar: data at byte") !=
          std::string::npos);
    // Zeros alone are an archive of no member.
    const std::string zeros = write_file(dir / "zeros.tar", std::string(10240, '\0'));
    CHECK(scan_tar(ReadOnlyFile(zeros)).samples() == 0);
  }
  SECTION("a key that comes back after another sample") {
    const std::string twice =
        write_tar(dir / "twice.tar",
                  {{"a.json", sample_json()}, {"b.json", sample_json()}, {"a.0.png", png}});
    const std::string message = error_of([&] { ShardDataset d(twice); });
    CHECK(message.find("twice.tar") != std::string::npos);
    CHECK(message.find("'a.0.png' has the key 'a' of an earlier sample") != std::string::npos);
  }
  SECTION("a member header that claims 10 GB") {
    std::string header = bytes.substr(0, 512);  // a.json's ustar header
    // 10 GiB does not fit ustar's 11 octal digits: GNU's base-256 form, as tar writes it.
    const uint64_t claimed = 10ull << 30;
    header[124] = static_cast<char>(0x80);
    for (int i = 0; i < 11; ++i) {
      header[135 - i] = static_cast<char>(i < 8 ? (claimed >> (8 * i)) & 0xff : 0);
    }
    std::memset(&header[148], ' ', 8);
    unsigned sum = 0;
    for (const char c : header) sum += static_cast<unsigned char>(c);
    std::snprintf(&header[148], 8, "%06o", sum);
    const std::string big = write_file(dir / "big.tar", header + bytes.substr(512));
    const std::string message = error_of([&] { ShardDataset d(big); });
    CHECK(message.find("big.tar") != std::string::npos);
    CHECK(message.find("a.json") != std::string::npos);
  }
  SECTION("not a tar at all") {
    for (const std::string& junk :
         {png, std::string(4096, 'x'), std::string("{}\n"), std::string(100, '\0')}) {
      const std::string path = write_file(dir / "junk.tar", junk);
      fs::remove(tar_index_path_beside(path));
      const std::string message = error_of([&] { ShardDataset d(path); });
      CHECK(message.find("junk.tar") != std::string::npos);
    }
  }
  SECTION("a shard without samples, an empty file, a missing shard") {
    const std::string empty = write_file(dir / "empty.tar", "");
    CHECK(error_of([&] { ShardDataset d(empty); }).find("hold no sample") != std::string::npos);
    const std::string keyless = write_tar(dir / "keyless.tar", {{"README", "x"}});
    CHECK(error_of([&] { ShardDataset d(keyless); }).find("hold no sample") != std::string::npos);
    CHECK(error_of([&] {
            ShardDataset d((dir / "x-{0..1}.tar").string());
          }).find("x-0.tar of the pattern does not exist") != std::string::npos);
  }
  SECTION("a shard truncated after it was indexed") {
    const std::string later = write_file(dir / "later.tar", bytes);
    const ShardDataset dataset(later);
    write_file(later, bytes.substr(0, 2048));
    INFO(error_of([&] { dataset.read(1); }));
    CHECK(error_of([&] { dataset.read(1); }).find("later.tar: the shard is 2048 bytes now") !=
          std::string::npos);
  }
}

TEST_CASE("shard paths: a pattern, a folder, one shard, a list file with its line in errors") {
  TempDir dir;
  for (int i = 0; i < 3; ++i) {
    write_tar(dir / ("d/p-" + std::to_string(i) + ".tar"),
              {{"k" + std::to_string(i) + ".json", sample_json()}});
  }
  write_file(dir / "d/notes.txt", "not a shard");
  const std::string d = (dir / "d").string();
  CHECK(resolve_shard_paths(d + "/p-{0..2}.tar").size() == 3);
  CHECK(resolve_shard_paths(d) ==
        std::vector<std::string>{d + "/p-0.tar", d + "/p-1.tar", d + "/p-2.tar"});
  CHECK(resolve_shard_paths(d + "/p-1.tar").size() == 1);
  const std::string list = write_file(dir / "list.txt", "# shards\nd/p-2.tar\n\n  d/p-0.tar \n");
  CHECK(resolve_shard_paths(list) == std::vector<std::string>{d + "/p-2.tar", d + "/p-0.tar"});
  const std::string bad = write_file(dir / "bad.txt", "d/p-0.tar\nd/p-9.tar\n");
  CHECK(error_of([&] { resolve_shard_paths(bad); }).find("bad.txt:2") != std::string::npos);
  const ShardDataset three(d);
  CHECK(three.size() == 3);
  CHECK(std::get<RawSample>(three.read(2)).where.str() == d + "/p-2.tar:k2");
  // auto takes a folder, a .tar or a pattern as shards; a list file needs the format.
  CHECK(open_dataset({d, 1.0, DatasetFormat::kAuto})->size() == 3);
  CHECK(open_dataset({list, 1.0, DatasetFormat::kWebDataset})->size() == 2);
  CHECK(dynamic_cast<Manifest*>(open_dataset({write_file(dir / "m.jsonl", sample_json() + "\n"),
                                              1.0, DatasetFormat::kAuto})
                                    .get()) != nullptr);
}

TEST_CASE("the demo as shards holds the same samples as the demo as manifest and files") {
  TempDir dir;
  DemoDataOptions options;
  options.out_dir = (dir / "files").string();
  options.train_samples = 60;
  options.val_samples = 7;
  options.seed = 3;
  write_demo_dataset(options);
  options.out_dir = (dir / "shards").string();
  options.format = DemoDataFormat::kWebDataset;
  options.samples_per_shard = 25;
  write_demo_dataset(options);
  CHECK(fs::exists(dir / "shards/train-000002.tar"));
  CHECK(fs::exists(dir / "shards/train-000002.tar.idx"));
  CHECK(fs::exists(dir / "shards/val/val-000000.tar"));

  const Manifest manifest((dir / "files/train.jsonl").string(), DatasetFormat::kAuto);
  const ShardDataset shards((dir / "shards").string());
  REQUIRE(shards.size() == manifest.size());
  REQUIRE(shards.shard_count() == 3);
  const auto config =
      vlm::load_config((vlm::test::source_dir() / "configs/demo.yaml").string(), {}).config;
  const DataSetup setup(config, 1);
  for (size_t i = 0; i < manifest.size(); ++i) {
    const auto a = std::get<RawSample>(manifest.read(i));
    const auto b = std::get<RawSample>(shards.read(i));
    REQUIRE(a.turns.size() == b.turns.size());
    for (size_t t = 0; t < a.turns.size(); ++t) CHECK(a.turns[t].text == b.turns[t].text);
    REQUIRE(a.images.size() == b.images.size());
    for (size_t k = 0; k < a.images.size(); ++k)
      CHECK(read_bytes(a.images[k]) == read_bytes(b.images[k]));
    const auto built_a = std::get<BuiltSample>(setup.builder().build(a));
    const auto built_b = std::get<BuiltSample>(setup.builder().build(b));
    CHECK(built_a.tokens.ids == built_b.tokens.ids);
    CHECK(built_a.item(i) == built_b.item(i));
  }

  // The data cursor of shards keeps their fingerprint; a rewritten shard is refused by name.
  DatasetSource source({{(dir / "shards").string(), 1.0, DatasetFormat::kWebDataset}},
                       setup.builder(), setup.skip_limits(), 5, true);
  for (int i = 0; i < 10; ++i) source.next();
  const nlohmann::json state = source.state({});
  CHECK(state.at("fingerprints").at("0").get<std::string>().size() == 3 * 16);
  DatasetSource again({{(dir / "shards").string(), 1.0, DatasetFormat::kWebDataset}},
                      setup.builder(), setup.skip_limits(), 5, true);
  again.restore(state);
  CHECK(again.next()->tokens == source.next()->tokens);
  const std::string second = (dir / "shards/train-000001.tar").string();
  const std::string original = read_file(second);
  write_tar(second, {{"new.json", sample_json()}});
  fs::remove(tar_index_path_beside(second));
  DatasetSource edited({{(dir / "shards").string(), 1.0, DatasetFormat::kWebDataset}},
                       setup.builder(), setup.skip_limits(), 5, true);
  const std::string message = error_of([&] { edited.restore(state); });
  CHECK(message.find("train-000001.tar") != std::string::npos);
  CHECK(message.find("not the one the checkpoint's data cursor was saved with") !=
        std::string::npos);
  // A cursor saved from a manifest does not resume shards.
  DatasetSource from_manifest({{(dir / "files/train.jsonl").string(), 1.0, DatasetFormat::kAuto}},
                              setup.builder(), setup.skip_limits(), 5, true);
  nlohmann::json manifest_state = from_manifest.state({});
  CHECK_FALSE(manifest_state.contains("fingerprints"));
  CHECK(error_of([&] { edited.restore(manifest_state); }).find("not saved from these shards") !=
        std::string::npos);
}
