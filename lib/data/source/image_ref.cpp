#include "data/source/image_ref.h"

#include "data/image/image_types.h"
#include "data/source/open_files.h"

namespace vlm::data {

std::vector<uint8_t> read_image_bytes(const ImageRef& ref) {
  if (!ref.in_shard()) return read_image_file(ref.path);
  const std::shared_ptr<const ReadOnlyFile> shard = open_shared(ref.path);
  std::vector<uint8_t> bytes(static_cast<size_t>(ref.size));
  shard->read_at(ref.offset, bytes.size(), bytes.data(), "member " + ref.member);
  return bytes;
}

}  // namespace vlm::data
