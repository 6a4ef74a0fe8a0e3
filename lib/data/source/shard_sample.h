// One WebDataset sample from its bytes (what one positioned read of the shard's index range
// returns): the members sharing its key, the conversation from `KEY.json` in either style a
// manifest line may have (the_cauldron `texts`, LLaVA `conversations`), and its images as
// members of the sample:
//  * listed in the JSON (cauldron `images`, LLaVA `image`), each by its member name
//    ("KEY.0.jpg") or by what follows the key ("0.jpg"); or
//  * when the JSON lists none, every JPEG, PNG and WebP member (.jpg, .jpeg, .png, .webp), in
//    the order of the number before the extension (`KEY.jpg` first, then `KEY.0.png`,
//    `KEY.1.jpg`, ...).
#pragma once

#include <cstdint>
#include <string>

#include "data/source/sample_reader.h"

namespace vlm::data {

// `bytes` were read from `shard_path`; `index` is the sample's number in the shard.
// Bad content is a SampleProblem ("no_json", "json_too_long", "missing_image", or the JSON's
// own); a DataError when the bytes are not one whole sample (the index does not fit the shard).
ParsedLine parse_shard_sample(FileBytes bytes, const std::string& shard_path, size_t index);

}  // namespace vlm::data
