#include "data/batch/host_batch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "data/image/image_decode.h"
#include "data/source/image_ref.h"

namespace vlm::data {
namespace {

// Decodes and splits every image of `sample` into `out`; returns false if one failed (its
// crops are left zero).
bool write_sample_crops(const BuiltSample& sample, const CollateOptions& options, float* out) {
  bool all_ok = true;
  const size_t crop_floats = static_cast<size_t>(3 * options.crop_size * options.crop_size);
  for (size_t i = 0; i < sample.images.size(); ++i) {
    const ImageGrid& grid = sample.grids[i];
    const ImageRef& image = sample.images[i];
    try {
      image_to_crops(decode_image_bytes(read_image_bytes(image), image.name()), grid,
                     options.normalize, out);
    } catch (const Error& e) {
      std::fill(out, out + crop_floats * static_cast<size_t>(grid.crops()), 0.0f);
      spdlog::warn("{}: image {} cannot be decoded, its sample carries no loss: {}",
                   sample.where.str(), image.name(), e.what());
      all_ok = false;
    }
    out += crop_floats * static_cast<size_t>(grid.crops());
  }
  return all_ok;
}

}  // namespace

HostBatch collate_host_batch(const MicroBatch& micro,
                             const std::vector<std::shared_ptr<const BuiltSample>>& samples,
                             const CollateOptions& options) {
  HostBatch b;
  b.rows = static_cast<int64_t>(micro.packs.size());
  b.crop_size = options.crop_size;
  for (const Pack& pack : micro.packs) {
    b.row_length = std::max(b.row_length, pack.tokens);
    b.num_crops += pack.crops;
    b.images += pack.images;
    b.tokens += pack.tokens;
    b.samples += static_cast<int64_t>(pack.items.size());
    for (const auto& item : pack.items) b.sample_ids.push_back(item.sample_id);
  }
  b.row_length = collated_row_length(b.row_length);
  b.source = micro;
  b.source_samples = samples;
  const bool with_tokens = !samples.empty() && samples.front() != nullptr;
  if (!with_tokens) {
    b.supervised_tokens = micro.shape.supervised;
    return b;  // a length stream: shapes only
  }

  const size_t cells = static_cast<size_t>(b.rows * b.row_length);
  b.input_ids.resize(cells);
  b.position_ids.resize(cells);
  b.labels.resize(cells);
  const size_t crop_floats = static_cast<size_t>(3 * options.crop_size * options.crop_size);
  float* crops = nullptr;
  if (options.decode_images && b.num_crops > 0) {
    const size_t floats = crop_floats * static_cast<size_t>(b.num_crops);
    if (options.crop_buffer) {  // every float is written below: decoded, or zero on failure
      CropBuffer buffer = options.crop_buffer(floats);
      crops = buffer.data;
      b.staged_crops = std::move(buffer.owner);
    } else {
      b.crops.assign(floats, 0.0f);
      crops = b.crops.data();
    }
  }

  PackedRow row;
  size_t next_sample = 0;
  int64_t crop_cursor = 0;
  b.cu_seqlens.push_back(0);
  for (int64_t r = 0; r < b.rows; ++r) {
    const Pack& pack = micro.packs[static_cast<size_t>(r)];
    const size_t first = next_sample;
    std::vector<SampleTokens> spans;
    for (size_t k = 0; k < pack.items.size(); ++k, ++next_sample) {
      const BuiltSample& s = *samples.at(next_sample);
      spans.push_back({s.tokens.ids.data(), s.tokens.supervised.data(),
                       static_cast<int64_t>(s.tokens.ids.size())});
    }
    build_packed_row_into(spans, b.row_length, options.pad_id, row);
    const int64_t offset = r * b.row_length;
    std::copy(row.input_ids.begin(), row.input_ids.end(), b.input_ids.begin() + offset);
    std::copy(row.position_ids.begin(), row.position_ids.end(), b.position_ids.begin() + offset);
    std::copy(row.labels.begin(), row.labels.end(), b.labels.begin() + offset);
    for (size_t k = 1; k < row.cu_seqlens.size(); ++k) {
      b.cu_seqlens.push_back(static_cast<int32_t>(offset + row.cu_seqlens[k]));
    }
    if (row.sample_tokens < b.row_length) {  // the padding is a segment of its own
      b.cu_seqlens.push_back(static_cast<int32_t>(offset + b.row_length));
    }
    for (size_t k = 0; k < pack.items.size(); ++k) {
      const BuiltSample& s = *samples[first + k];
      if (options.decode_images && !s.images.empty()) {
        float* out = crops + crop_floats * static_cast<size_t>(crop_cursor);
        if (!write_sample_crops(s, options, out)) {
          ++b.undecodable_images;
          const int64_t begin = offset + row.cu_seqlens[k];
          const int64_t end = offset + row.cu_seqlens[k + 1];
          std::fill(b.labels.begin() + begin, b.labels.begin() + end, kIgnoreLabel);
        }
      }
      crop_cursor += s.tokens.crops;
    }
  }
  for (size_t i = 0; i < cells; ++i) {
    if (b.input_ids[i] == options.image_token_id)
      b.image_token_index.push_back(static_cast<int64_t>(i));
    if (b.labels[i] != kIgnoreLabel) ++b.supervised_tokens;
  }
  return b;
}

namespace {

MicroBatch micro_batch_of(std::vector<Pack> packs, const MicroBatch& like) {
  MicroBatch m;
  m.packs = std::move(packs);
  for (const Pack& p : m.packs) m.shape.add(p);
  m.cost = like.cost *
           (like.shape.tokens > 0 ? static_cast<double>(m.shape.tokens) / like.shape.tokens : 0.5);
  return m;
}

}  // namespace

std::optional<std::pair<MicroBatch, MicroBatch>> split_micro_batch(const MicroBatch& micro) {
  if (micro.packs.size() >= 2) {
    const auto half =
        micro.packs.begin() + static_cast<std::ptrdiff_t>((micro.packs.size() + 1) / 2);
    return std::make_pair(micro_batch_of({micro.packs.begin(), half}, micro),
                          micro_batch_of({half, micro.packs.end()}, micro));
  }
  if (micro.packs.size() == 1 && micro.packs[0].items.size() >= 2) {
    const auto& items = micro.packs[0].items;
    Pack first, second;
    const size_t half = (items.size() + 1) / 2;
    for (size_t i = 0; i < items.size(); ++i) (i < half ? first : second).add(items[i]);
    return std::make_pair(micro_batch_of({first}, micro), micro_batch_of({second}, micro));
  }
  return std::nullopt;
}

HostBatch collate_again(const HostBatch& batch, const CollateOptions& options) {
  return collate_host_batch(batch.source, batch.source_samples, options);
}

std::optional<std::pair<HostBatch, HostBatch>> split_host_batch(const HostBatch& batch,
                                                                const CollateOptions& options) {
  const auto halves = split_micro_batch(batch.source);
  if (!halves) return std::nullopt;
  // The samples of each half, in item order (they follow the source's order).
  std::map<uint64_t, std::shared_ptr<const BuiltSample>> by_id;
  size_t k = 0;
  for (const Pack& p : batch.source.packs) {
    for (const PackItem& item : p.items) by_id[item.sample_id] = batch.source_samples.at(k++);
  }
  auto samples_of = [&by_id](const MicroBatch& m) {
    std::vector<std::shared_ptr<const BuiltSample>> out;
    for (const Pack& p : m.packs) {
      for (const PackItem& item : p.items) out.push_back(by_id.at(item.sample_id));
    }
    return out;
  };
  return std::make_pair(collate_host_batch(halves->first, samples_of(halves->first), options),
                        collate_host_batch(halves->second, samples_of(halves->second), options));
}

}  // namespace vlm::data
