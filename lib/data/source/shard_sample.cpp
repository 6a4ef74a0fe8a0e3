#include "data/source/shard_sample.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/source/manifest.h"
#include "data/source/tar_index.h"
#include "data/source/tar_reader.h"

namespace vlm::data {
namespace {

bool is_image_extension(std::string extension) {
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == "jpg" || extension == "jpeg" || extension == "png" || extension == "webp";
}

// The order of an unlisted image member by its suffix: "jpg" first (-1), then "N.ext" by N,
// then anything else by name.
std::pair<int64_t, std::string> image_order(const std::string& suffix) {
  const size_t dot = suffix.rfind('.');
  if (dot == std::string::npos) return {-1, suffix};
  const std::string number = suffix.substr(0, dot);
  const bool numeric = !number.empty() && number.size() <= 9 &&
                       std::all_of(number.begin(), number.end(),
                                   [](unsigned char c) { return std::isdigit(c) != 0; });
  return {numeric ? std::stoll(number) : int64_t{1} << 40, suffix};
}

SampleProblem problem(std::string reason, std::string message, const std::string& where) {
  return SampleProblem{std::move(reason), std::move(message), SourceLocation{where}};
}

}  // namespace

ParsedLine parse_shard_sample(FileBytes bytes, const std::string& shard_path, size_t index) {
  const uint64_t offset = bytes.offset;
  const auto mismatch = [&](const std::string& why) -> DataError {
    return DataError("sample " + std::to_string(index) + " (bytes " + std::to_string(offset) +
                         " to " + std::to_string(offset + bytes.size) +
                         ") does not match the shard's index: " + why + "; delete " +
                         tar_index_path_beside(shard_path) + " (or its copy in the cache, " +
                         tar_index_path_in_cache(shard_path) + ") to have it rebuilt",
                     SourceLocation{shard_path});
  };
  std::vector<TarMember> members;
  std::optional<std::string> key;
  try {
    TarReader reader(bytes.data.get(), bytes.size, offset, shard_path);
    while (std::optional<TarMember> member = reader.next()) {
      const std::optional<std::string> member_key =
          member->regular ? webdataset_key(member->name) : std::nullopt;
      if (members.empty() && !key && (!member_key || member->header != offset)) {
        throw mismatch("it does not start with a member of a sample");
      }
      if (!member_key) continue;  // ignored when the shard was indexed
      if (!key) key = member_key;
      if (*member_key != *key) {
        throw mismatch("it holds members of two samples ('" + *key + "', '" + *member_key + "')");
      }
      members.push_back(std::move(*member));
    }
  } catch (const DataError& e) {
    if (e.message().find("does not match the shard's index") != std::string::npos) throw;
    throw mismatch(e.message());
  }
  if (!key) throw mismatch("it holds no member");
  const std::string where = shard_path + ":" + *key;
  const size_t key_length = key->size() + 1;  // "KEY."
  const auto suffix = [&](const TarMember& m) { return m.name.substr(key_length); };
  const auto data_of = [&](const TarMember& m) {
    return bytes.view().substr(static_cast<size_t>(m.data - offset), static_cast<size_t>(m.size));
  };

  const auto json = std::find_if(members.begin(), members.end(),
                                 [&](const TarMember& m) { return suffix(m) == "json"; });
  if (json == members.end()) {
    std::string names;
    for (const TarMember& m : members) names += (names.empty() ? "" : ", ") + m.name;
    return problem("no_json", "the sample has no " + *key + ".json (members: " + names + ")",
                   where);
  }
  if (json->size > kMaxSampleLineBytes) {
    return problem(
        "json_too_long",
        json->name + " is longer than " + std::to_string(kMaxSampleLineBytes >> 20) + " MiB",
        where);
  }
  ParsedLine parsed = parse_manifest_line(data_of(*json), DatasetFormat::kAuto, "",
                                          SourceLocation{shard_path + ":" + json->name});
  auto* sample = std::get_if<RawSample>(&parsed);
  if (sample == nullptr) {
    std::get<SampleProblem>(parsed).where = SourceLocation{shard_path + ":" + json->name};
    return parsed;
  }
  sample->where = SourceLocation{where};

  // The images: as the JSON lists them, or every image member in the order of its number.
  std::vector<const TarMember*> images;
  if (!sample->images.empty()) {
    for (const ImageRef& listed : sample->images) {
      const auto found = std::find_if(members.begin(), members.end(), [&](const TarMember& m) {
        return m.name == listed.path || suffix(m) == listed.path ||
               m.name.substr(m.name.rfind('/') + 1) == listed.path;
      });
      if (found == members.end()) {
        return problem("missing_image",
                       "the JSON lists the image '" + listed.path + "', which is no member of " +
                           "the sample (" + *key + "." + listed.path + ")",
                       where);
      }
      images.push_back(&*found);
    }
  } else {
    for (const TarMember& m : members) {
      const std::string s = suffix(m);
      if (is_image_extension(s.substr(s.rfind('.') + 1))) images.push_back(&m);
    }
    std::stable_sort(images.begin(), images.end(), [&](const TarMember* a, const TarMember* b) {
      return image_order(suffix(*a)) < image_order(suffix(*b));
    });
    if (images.size() > kMaxImagesPerSample) {
      return problem("too_many_image_paths",
                     std::to_string(images.size()) + " image members; a sample may have at most " +
                         std::to_string(kMaxImagesPerSample),
                     where);
    }
  }
  sample->images.clear();
  for (const TarMember* m : images) {
    sample->images.push_back(ImageRef{shard_path, m->name, m->data, m->size});
  }
  sample->bytes = std::move(bytes);
  return parsed;
}

}  // namespace vlm::data
