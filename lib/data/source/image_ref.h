// Where an image's bytes are: a file of its own (a manifest's image path), or a member of a
// WebDataset tar shard, whose data lie contiguously in the shard at a known offset (an
// uncompressed tar stores each member's bytes in one piece), so the loader reads them with one
// positioned read, no tar parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm::data {

struct ImageRef {
  std::string path;     // the image file, or the shard holding the member
  std::string member;   // the member's name inside the shard; empty for a file
  uint64_t offset = 0;  // a member's data: first byte in the shard, and size
  uint64_t size = 0;

  bool in_shard() const { return !member.empty(); }
  // "path" for a file, "shard:member" for a member: what errors and logs name.
  std::string name() const { return in_shard() ? path + ":" + member : path; }
  bool operator==(const ImageRef& o) const {
    return path == o.path && member == o.member && offset == o.offset && size == o.size;
  }
};

// The image's encoded bytes; DataError naming it when they cannot be read.
std::vector<uint8_t> read_image_bytes(const ImageRef& ref);

}  // namespace vlm::data
