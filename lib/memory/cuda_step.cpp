#include "memory/cuda_step.h"

#include <algorithm>
#include <initializer_list>
#include <stdexcept>

#include "core/dist_env.h"
#include "memory/cuda_caching_allocator.h"
#include "memory/parameter_tensors.h"
#include "spec/derived.h"

namespace vlm::memory::cuda {
namespace {

using Id = int32_t;


// AdamW's parameter order (train/optimizer.cpp GroupedAdamW): named_parameters order (a
// module's own parameters before its children's: the ViT's positions before its patch
// kernel), grouped vision, projector, language, each with weight decay first.
struct OptimizerOrder {
  std::vector<int64_t> elements;      // trainable tensors in group order
  std::vector<size_t> group_sizes;    // tensors per non-empty group
  size_t decoder_groups = 0;          // the last groups: the decoder's
  int64_t largest = 0;
};

bool decays(const std::string& name) {
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("position_embedding") || has("token_embedding")) return false;  // embeddings
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) return false;
  return !(has("norm") || has(".ln1.") || has(".ln2."));  // norm weights: one dimension
}

OptimizerOrder optimizer_order(const MemorySpec& spec, bool image_path) {
  std::vector<ParameterTensor> tensors = parameter_tensors(spec);
  // named_parameters lists the patch embedding's own positions before its conv's tensors.
  const auto positions = std::find_if(tensors.begin(), tensors.end(), [](const ParameterTensor& t) {
    return t.name == "vision_encoder.patch_embedding.position_embedding";
  });
  if (positions != tensors.end()) std::rotate(tensors.begin(), positions, positions + 1);
  OptimizerOrder order;
  for (const char* module : {"vision_encoder.", "MP.", "decoder."}) {
    if (!image_path && std::string(module) != "decoder.") continue;  // no gradient yet
    for (const bool decay : {true, false}) {
      size_t count = 0;
      for (const ParameterTensor& t : tensors) {
        if (!t.trainable || t.name.rfind(module, 0) != 0 || decays(t.name) != decay) continue;
        order.elements.push_back(t.elements);
        order.largest = std::max(order.largest, t.elements);
        ++count;
      }
      if (count > 0) {
        order.group_sizes.push_back(count);
        if (std::string(module) == "decoder.") ++order.decoder_groups;
      }
    }
  }
  return order;
}

// One ViT block's tensors that outlive its statements (docs/memory.md, "On CUDA").
struct VitBlock {
  Id ln1 = -1, ln1m = -1, ln1r = -1, qkv_b = -1, qkv_w = -1, qkv_x = -1, qkv = -1, att = -1,
     lse = -1, r16 = -1, r8 = -1, o_b = -1, o_w = -1, o_out = -1, h = -1, ln2 = -1, ln2m = -1,
     ln2r = -1, fc1_b = -1, fc1_w = -1, fc1_x = -1, fc1 = -1, gelu = -1, fc2_b = -1, fc2_w = -1,
     fc2_out = -1, out = -1;
  std::vector<Id> cached;  // autocast's casts of the block's parameters, freed with the scope
};

struct DecBlock {
  Id n1 = -1, n1r = -1, qkv_cat = -1, qkv_w = -1, qkv_x = -1, qkv = -1, qrot = -1, krot = -1,
     v = -1, o = -1, lse = -1, r16 = -1, r8 = -1, o_w = -1, o_out = -1, h = -1, n2 = -1, n2r = -1,
     gu_cat = -1, gu_w = -1, gu_x = -1, gu = -1, silu = -1, mul = -1, d_w = -1, d_out = -1,
     out = -1;
};

}  // namespace

std::string unmodelled(const MemorySpec& spec) {
  const auto& l = spec.dims.language;
  if (spec.precision != ComputePrecision::kBf16) {
    return "fp32 training on CUDA (the decoder's grouped attention there) is not replayed yet";
  }
  if (!spec.language.trainable) return "a frozen decoder on CUDA is not replayed yet";
  if (!spec.projector.trainable) return "a frozen projector on CUDA is not replayed yet";
  if (!l.tie_embeddings) return "an untied head on CUDA is not replayed yet";
  if (spec.levers.vision_chunk_crops > 0 &&
      (spec.levers.checkpoint_vision || !spec.vision.trainable)) {
    return "model.vision_chunk_crops with a checkpointed or frozen ViT on CUDA is not replayed yet";
  }
  return "";
}

// The walk, in the order the trainer's code runs it (lib/model, train/step_runner.cpp).
struct StepStream::Impl {
  StepStream& s;
  // Dimensions (spec/model_spec.h): ViT, projector, decoder.
  int64_t img, patch, d, vl, h, m, ps, D, Ll, Hq, Hkv, hd, Fm, V, P, K, Ti, Pq;
  bool ckpt_v, ckpt_l, freeze_v, frozen_bf16;
  // The micro-batch.
  int64_t N = 0, S = 0, L = 0, n = 0, nP = 0;
  int micro = 0;
  Id lsum = -1;
  // Forward state the backward reads.
  Id cos_b = -1, sin_b = -1;
  // The image path per chunk of crops (model.vision_chunk_crops; one chunk without it).
  struct VitChunk {
    int64_t crops = 0;
    Id x_v0 = -1, pe_x = -1, lnf = -1, lnfm = -1, lnfr = -1, vit_last = -1;
    Id mp_w = -1, mp_x = -1, mp_out = -1;
    std::vector<VitBlock> blocks;
  };
  std::vector<VitChunk> chunks;
  Id x_v0 = -1, lnf = -1, lnfm = -1, lnfr = -1;  // a frozen ViT's (one chunk)
  void set_chunk(int64_t crops) { n = crops, nP = n * P; }
  std::vector<DecBlock> dec;
  std::vector<Id> dec_inputs;

  explicit Impl(StepStream& stream) : s(stream) {
    const spec::ModelSpec& dims = s.spec_.dims;
    img = dims.vision.image_size;
    patch = dims.vision.patch_size;
    d = dims.vision.hidden_size;
    vl = dims.vision.num_layers;
    h = dims.vision.num_heads;
    m = dims.vision.mlp_size;
    ps = dims.projector.pixel_shuffle;
    D = dims.language.hidden_size;
    Ll = dims.language.num_layers;
    Hq = dims.language.num_heads;
    Hkv = dims.language.num_kv_heads;
    hd = spec::language_head_dim(dims.language);
    Fm = dims.language.mlp_size;
    V = spec::language_vocab_rows(dims.language);
    P = (img / patch) * (img / patch);
    K = 3 * patch * patch;
    Ti = P / (ps * ps);
    Pq = (Hq + 2 * Hkv) * hd;
    ckpt_v = s.spec_.levers.checkpoint_vision;
    ckpt_l = s.spec_.levers.checkpoint_language;
    freeze_v = !s.spec_.vision.trainable;
    frozen_bf16 = freeze_v && s.spec_.vision.parameter_bytes == 2;
  }

  // A tensor of no bytes is no request (the allocator skips size 0): kNone, freed as nothing.
  static constexpr Id kNone = -2;
  Id A(int64_t bytes) { return bytes > 0 ? s.alloc(bytes) : kNone; }
  void F(std::initializer_list<Id> ids) {
    for (const Id id : ids) {
      if (id != kNone) s.free(id);
    }
  }
  // AccumulateGrad on an fp32 gradient: added into .grad and freed, or stolen as the .grad
  // (the first backward to reach the parameter's tower).
  void acc(Id grad) {
    if (s.decoder_grads_) F({grad});
  }
  void acc_image(Id grad) {
    if (s.image_grads_) F({grad});
  }

  // cuBLAS's workspaces, at a thread's first GEMM (cuda_kernels.h).
  void gemm_workspace(bool backward, bool lt) {
    bool& cublas = backward ? s.workspace_bwd_ : s.workspace_fwd_;
    bool& cublas_lt = backward ? s.workspace_lt_bwd_ : s.workspace_lt_fwd_;
    if (!cublas) {
      A(cublas_workspace_bytes(s.gpu_));
      cublas = true;
    }
    if (lt && !cublas_lt) {
      A(kCublasLtWorkspaceBytes);
      cublas_lt = true;
    }
  }

  // cu_seqlens as int32 on the device, cached per thread (model/varlen_attention_cuda.cpp).
  void new_bounds(bool backward) {
    Id& cached = backward ? s.bounds_bwd_ : s.bounds_fwd_;
    const Id fresh = A((S + 1) * 4);
    if (cached >= 0) s.free(cached);
    cached = fresh;
  }

  // --- the image path -------------------------------------------------------------------
  // A chunk's place in the backward, which runs the chunks last first.
  struct Place {
    size_t processed = 0, count = 1;
    bool first() const { return processed == 0; }
    bool last() const { return processed + 1 == count; }
  };
  // A chunk's gradient of a parameter joins the engine's input buffer `buffer`: the first
  // chunk processed leaves it there; the second, when the buffered gradient is a view (of a
  // cast weight's transpose, a bias's sum_to, the patch kernel's view), is summed out of place;
  // every other one is added in place (torch/csrc/autograd/input_buffer.cpp, LibTorch 2.x).
  void join(Id& buffer, Id grad, int64_t bytes, const Place& place, bool view) {
    if (place.first()) {
      buffer = grad;
    } else if (view && place.processed == 1) {
      const Id sum = A(bytes);
      F({buffer, grad});
      buffer = sum;
    } else {
      F({grad});
    }
  }
  // A cached cast's gathered bf16 gradient converted to fp32 (ToCopyBackward0) and accumulated.
  void convert(Id& buffer, int64_t fp32_bytes) {
    const Id fp32 = A(fp32_bytes);
    F({buffer});
    acc_image(fp32);
  }
  struct LinearGrads {
    Id w = -1, b = -1;
  };
  struct BlockGrads {
    LinearGrads qkv, o, fc1, fc2;
    Id ln1_g = -1, ln1_b = -1, ln2_g = -1, ln2_b = -1;
  };
  struct ImageGrads {
    explicit ImageGrads(size_t layers) : blocks(layers) {}
    std::vector<BlockGrads> blocks;
    Id projector = -1, lnf_g = -1, lnf_b = -1, positions = -1, pe_w = -1, pe_b = -1;
    bool positions_shared = false;  // the buffered positions' gradient is the residual's
  };
  // A block under autograd (the forward, or a checkpointed block's recompute).
  // `cast`: the chunk that casts the block's weights and biases (the first: autocast caches the
  // casts of leaf parameters for its scope, and the later chunks reuse them).
  VitBlock vit_block_grad(bool recompute, bool cast = true) {
    const auto C = [&](int64_t bytes) { return cast ? A(bytes) : kNone; };
    VitBlock b;
    b.ln1 = A(nP * d * 4), b.ln1m = A(nP * 4), b.ln1r = A(nP * 4);
    b.qkv_b = C(3 * d * 2), b.qkv_w = C(3 * d * d * 2), b.qkv_x = A(nP * d * 2);
    b.qkv = A(nP * 3 * d * 2);
    if (recompute) gemm_workspace(true, true);
    b.att = A(nP * d * 2), b.lse = A(n * h * P * 4), b.r16 = A(kFlashRngStateBytes),
    b.r8 = A(kFlashRngPlaceholderBytes);
    b.o_b = C(d * 2), b.o_w = C(d * d * 2), b.o_out = A(nP * d * 2);
    b.h = A(nP * d * 4);
    F({b.o_out, b.ln1});
    b.ln2 = A(nP * d * 4), b.ln2m = A(nP * 4), b.ln2r = A(nP * 4);
    b.fc1_b = C(m * 2), b.fc1_w = C(m * d * 2), b.fc1_x = A(nP * d * 2);
    b.fc1 = A(nP * m * 2), b.gelu = A(nP * m * 2);
    b.fc2_b = C(d * 2), b.fc2_w = C(d * m * 2), b.fc2_out = A(nP * d * 2);
    b.out = A(nP * d * 4);
    F({b.fc2_out, b.ln2});
    b.cached = {b.qkv_b, b.o_b, b.fc1_b, b.fc2_b};
    return b;
  }

  // A checkpointed block's forward without a graph; the weights still require a gradient, so
  // autocast caches their casts until the forward's end.
  VitBlock vit_block_checkpointed() {
    VitBlock b;
    b.ln1 = A(nP * d * 4), b.ln1m = A(nP * 4), b.ln1r = A(nP * 4);
    F({b.ln1m, b.ln1r});
    b.qkv_b = A(3 * d * 2), b.qkv_w = A(3 * d * d * 2), b.qkv_x = A(nP * d * 2);
    b.qkv = A(nP * 3 * d * 2);
    F({b.qkv_x});
    b.att = A(nP * d * 2), b.lse = A(n * h * P * 4), b.r16 = A(kFlashRngStateBytes),
    b.r8 = A(kFlashRngPlaceholderBytes);
    F({b.lse, b.r16, b.r8});
    b.o_b = A(d * 2), b.o_w = A(d * d * 2), b.o_out = A(nP * d * 2);
    F({b.att, b.qkv});
    b.h = A(nP * d * 4);
    F({b.o_out, b.ln1});
    b.ln2 = A(nP * d * 4), b.ln2m = A(nP * 4), b.ln2r = A(nP * 4);
    F({b.ln2m, b.ln2r});
    b.fc1_b = A(m * 2), b.fc1_w = A(m * d * 2), b.fc1_x = A(nP * d * 2);
    b.fc1 = A(nP * m * 2);
    F({b.fc1_x});
    b.gelu = A(nP * m * 2);
    b.fc2_b = A(d * 2), b.fc2_w = A(d * m * 2), b.fc2_out = A(nP * d * 2);
    F({b.gelu, b.fc1});
    b.out = A(nP * d * 4);
    F({b.fc2_out, b.ln2, b.h});
    b.cached = {b.qkv_b, b.qkv_w, b.o_b, b.o_w, b.fc1_b, b.fc1_w, b.fc2_b, b.fc2_w};
    return b;
  }

  // A frozen ViT's block (no autograd). fp32 weights: each linear casts its bias, weight and
  // input and frees them after the GEMM; bf16 weights: nothing cast but the LayerNorms'
  // parameters and input (autocast's fp32 list), and the residual stream is bf16.
  Id vit_block_frozen(Id x) {
    const int64_t stream = frozen_bf16 ? 2 : 4;
    const auto layer_norm = [&] {
      Id w32 = -1, b32 = -1, x32 = -1;
      if (frozen_bf16) w32 = A(d * 4), b32 = A(d * 4), x32 = A(nP * d * 4);
      const Id out = A(nP * d * 4), mean = A(nP * 4), rstd = A(nP * 4);
      F({mean, rstd});
      if (frozen_bf16) F({x32, b32, w32});
      return out;
    };
    const auto linear = [&](int64_t in, int64_t out_width, bool cast_input) {
      Id bias = -1, weight = -1, input = -1;
      if (!frozen_bf16) bias = A(out_width * 2), weight = A(out_width * in * 2);
      if (cast_input) input = A(nP * in * 2);
      const Id out = A(nP * out_width * 2);
      if (cast_input) F({input});
      if (!frozen_bf16) F({weight, bias});
      return out;
    };
    const Id ln1 = layer_norm();
    const Id qkv = linear(d, 3 * d, true);
    const Id att = A(nP * d * 2), lse = A(n * h * P * 4), r16 = A(kFlashRngStateBytes),
             r8 = A(kFlashRngPlaceholderBytes);
    F({lse, r16, r8});
    const Id o = linear(d, d, false);
    F({att, qkv});
    const Id hidden = A(nP * d * stream);
    F({o, ln1});
    const Id ln2 = layer_norm();
    const Id fc1 = linear(d, m, true);
    const Id gelu = A(nP * m * 2);
    const Id fc2 = linear(m, d, false);
    F({gelu, fc1});
    const Id out = A(nP * d * stream);
    F({fc2, ln2, hidden});
    F({x});  // the block input: the caller's variable is reassigned
    return out;
  }

  // The ViT to its final LayerNorm's output; the casts autocast caches are returned.
  std::vector<Id> vit_forward() {
    std::vector<Id> cache;
    if (freeze_v) {
      Id crops16 = -1, x = -1;
      if (frozen_bf16) {
        crops16 = A(n * 3 * img * img * 2);
        const Id patches = A(nP * K * 2);
        const Id pe_out = A(nP * d * 2);
        gemm_workspace(false, true);
        x = A(nP * d * 2);
        F({pe_out, patches});
      } else {
        const Id patches = A(nP * K * 4);
        const Id pe_b = A(d * 2), wc = A(d * K * 2), px = A(nP * K * 2);
        const Id pe_out = A(nP * d * 2);
        gemm_workspace(false, true);
        F({px, wc, pe_b});
        x = A(nP * d * 4);
        F({pe_out, patches});
      }
      for (int64_t l = 0; l < vl; ++l) x = vit_block_frozen(x);
      Id w32 = -1, b32 = -1, x32 = -1;
      if (frozen_bf16) w32 = A(d * 4), b32 = A(d * 4), x32 = A(nP * d * 4);
      lnf = A(nP * d * 4), lnfm = A(nP * 4), lnfr = A(nP * 4);
      F({lnfm, lnfr});
      if (frozen_bf16) F({x32, b32, w32});
      F({x});
      if (frozen_bf16) F({crops16});  // chunk.to(bf16) dies with the ViT call's statement
      return cache;
    }
    // Trained: chunk by chunk (VisionLanguageModel::encode_crops), each through the patch
    // embedding, the blocks, the final LayerNorm and the projector; the first chunk casts the
    // weights and biases, which autocast caches for the rest (the patch kernel and the
    // projector's weight are views, cast anew per chunk).
    const int64_t total = n, per = s.spec_.levers.vision_chunk_crops;
    chunks.clear();
    for (int64_t first = 0; first<total; first += per> 0 ? per : total) {
      VitChunk c;
      c.crops = per > 0 ? std::min(per, total - first) : total;
      set_chunk(c.crops);
      const bool cast = chunks.empty();
      const Id patches = A(nP * K * 4);
      const Id pe_b = cast ? A(d * 2) : kNone;
      const Id pe_wc = A(d * K * 2);
      c.pe_x = A(nP * K * 2);
      const Id pe_out = A(nP * d * 2);
      gemm_workspace(false, true);
      F({pe_wc});
      c.x_v0 = A(nP * d * 4);
      F({pe_out, patches});
      if (pe_b != kNone) cache.push_back(pe_b);
      for (int64_t l = 0; l < vl; ++l) {
        c.blocks.push_back(ckpt_v ? vit_block_checkpointed() : vit_block_grad(false, cast));
        for (const Id k : c.blocks.back().cached) {
          if (k != kNone) cache.push_back(k);
        }
      }
      c.lnf = A(nP * d * 4), c.lnfm = A(nP * 4), c.lnfr = A(nP * 4);
      c.vit_last = c.blocks.empty() ? c.x_v0 : c.blocks.back().out;
      // The projector (pixel shuffle, a bias-free linear): its weight's cast is kept per chunk.
      const Id shuffled = A(nP * d * 4);
      c.mp_w = A(D * d * ps * ps * 2), c.mp_x = A(nP * d * 2);
      c.mp_out = A(n * Ti * D * 2);
      F({shuffled, c.lnf});
      chunks.push_back(std::move(c));
    }
    set_chunk(total);
    return cache;
  }

  // A linear's backward on CUDA (addmm): dX, dW, db, and the bias gradient's reduction staging.
  struct AddmmGrads {
    Id dx, dw, db;
  };
  AddmmGrads addmm_backward(int64_t in, int64_t out) {
    AddmmGrads g{A(nP * in * 2), A(out * in * 2), A(out * 2)};
    const ReduceStaging staging = reduce_staging(s.gpu_, out, nP, 2, false);
    if (staging.staging > 0) {
      const Id st = A(staging.staging), sem = A(staging.semaphores);
      F({sem, st});
    }
    return g;
  }

  // One ViT block's backward from the residual gradient `G` (shared, accumulated in place;
  // checkpointed: the node's own, and the block's gradients are captured, returned in `keep`),
  // for the chunk at `place`, gathering the parameters' gradients in `grads`.
  Id vit_block_backward(const VitBlock& s_, Id G, Id xin, bool ckpt, std::vector<Id>& keep,
                        const Place& place, BlockGrads& grads) {
    // A linear's weight and bias gradients (bf16, of the cached casts) gathered over the chunks;
    // once the last has added its own, converted to fp32 (ToCopyBackward0), weight first. A
    // checkpointed block's are captured by autograd::grad instead (one chunk).
    const auto gather = [&](LinearGrads& g, Id dw, Id db, int64_t in, int64_t out) {
      join(g.b, db, out * 2, place, true);
      join(g.w, dw, out * in * 2, place, true);
    };
    const auto to_fp32 = [&](LinearGrads& g, int64_t in, int64_t out) {
      if (!place.last()) return;
      if (ckpt) {
        const Id w32 = A(out * in * 4);
        F({g.w});
        keep.push_back(w32);
        const Id b32 = A(out * 4);
        F({g.b});
        keep.push_back(b32);
        return;
      }
      convert(g.w, out * in * 4);
      convert(g.b, out * 4);
    };
    const auto layer_norm = [&](Id& g_buffer, Id& b_buffer, Id dg, Id db) {
      if (ckpt) {
        keep.push_back(dg);
        keep.push_back(db);
        return;
      }
      join(g_buffer, dg, d * 4, place, false);
      join(b_buffer, db, d * 4, place, false);
      if (place.last()) {
        acc_image(g_buffer);
        acc_image(b_buffer);
      }
    };
    const Id g16 = A(nP * d * 2);
    const AddmmGrads fc2 = addmm_backward(m, d);
    F({g16, s_.gelu, s_.fc2_w});
    gather(grads.fc2, fc2.dw, fc2.db, m, d);
    to_fp32(grads.fc2, m, d);
    const Id gg = A(nP * m * 2);
    F({fc2.dx, s_.fc1});
    const AddmmGrads fc1 = addmm_backward(d, m);
    F({gg, s_.fc1_x, s_.fc1_w});
    gather(grads.fc1, fc1.dw, fc1.db, d, m);
    const Id fc1_dx32 = A(nP * d * 4);
    F({fc1.dx});
    to_fp32(grads.fc1, d, m);
    const Id dn2 = A(nP * d * 4), dg2 = A(d * 4), db2 = A(d * 4);
    F({fc1_dx32, s_.h, s_.ln2m, s_.ln2r});
    Id R = G;
    if (ckpt) {
      R = A(nP * d * 4);  // summed out of place: the outer node holds the output's gradient
    }
    F({dn2});
    layer_norm(grads.ln2_g, grads.ln2_b, dg2, db2);
    const Id g16a = A(nP * d * 2);
    const AddmmGrads o = addmm_backward(d, d);
    F({g16a, s_.o_w});
    gather(grads.o, o.dw, o.db, d, d);
    to_fp32(grads.o, d, d);
    // Flash attention's backward (sdpa on [n, h, P, d/h], bf16).
    const Id dq = A(nP * d * 2), dk = A(nP * d * 2), dv = A(nP * d * 2);
    const Id sd = A(flash_softmax_d_bytes(n, P, h));
    const Id dqacc = A(flash_dq_accum_bytes(n, P, h, d / h));
    F({dqacc, sd, o.dx, s_.qkv, s_.lse, s_.att, s_.r16, s_.r8});
    const Id gqkv = A(nP * 3 * d * 2);
    F({dq, dk, dv});
    const AddmmGrads qkv = addmm_backward(d, 3 * d);
    F({gqkv, s_.qkv_x, s_.qkv_w});
    gather(grads.qkv, qkv.dw, qkv.db, d, 3 * d);
    const Id qkv_dx32 = A(nP * d * 4);
    F({qkv.dx});
    to_fp32(grads.qkv, d, 3 * d);
    const Id dn1 = A(nP * d * 4), dg1 = A(d * 4), db1 = A(d * 4);
    if (ckpt) {
      F({qkv_dx32, s_.ln1m, s_.ln1r, dn1});
    } else {
      F({qkv_dx32, xin, s_.ln1m, s_.ln1r, dn1});
    }
    layer_norm(grads.ln1_g, grads.ln1_b, dg1, db1);
    return R;
  }

  // --- the decoder ----------------------------------------------------------------------
  // RoPE on q then k (language_model.cpp apply_rotary): only the rotated tensor stays.
  void rotary(DecBlock& b) {
    for (const bool q : {true, false}) {
      const int64_t width = N * (q ? Hq : Hkv) * hd;
      const Id neg = A(width), cat = A(width * 2);
      F({neg});
      const Id m2 = A(width * 2), m1 = A(width * 2);
      (q ? b.qrot : b.krot) = A(width * 2);
      F({m1, m2, cat});
    }
  }

  DecBlock dec_block_grad(bool backward_thread, bool first_layer_of_pass) {
    DecBlock b;
    b.n1 = A(N * D * 4), b.n1r = A(N * 4);
    b.qkv_cat = A(Pq * D * 4), b.qkv_w = A(Pq * D * 2), b.qkv_x = A(N * D * 2);
    b.qkv = A(N * Pq * 2);
    gemm_workspace(backward_thread, false);  // a no-op once the thread has its workspace
    F({b.qkv_cat});
    rotary(b);
    if (first_layer_of_pass) new_bounds(backward_thread);
    b.v = A(N * Hkv * hd * 2);
    b.o = A(N * Hq * hd * 2), b.lse = A(Hq * N * 4), b.r16 = A(kFlashRngStateBytes),
    b.r8 = A(kFlashRngPlaceholderBytes);
    b.o_w = A(D * Hq * hd * 2), b.o_out = A(N * D * 2);
    F({b.qkv});
    b.h = A(N * D * 4);
    F({b.o_out, b.n1});
    b.n2 = A(N * D * 4), b.n2r = A(N * 4);
    b.gu_cat = A(2 * Fm * D * 4), b.gu_w = A(2 * Fm * D * 2), b.gu_x = A(N * D * 2);
    b.gu = A(N * 2 * Fm * 2);
    F({b.gu_cat});
    b.silu = A(N * Fm * 2), b.mul = A(N * Fm * 2);
    b.d_w = A(Fm * D * 2), b.d_out = A(N * D * 2);
    b.out = A(N * D * 4);
    F({b.d_out, b.n2});
    return b;
  }

  DecBlock dec_block_checkpointed(bool first_layer) {
    DecBlock b;
    b.n1 = A(N * D * 4), b.n1r = A(N * 4);
    F({b.n1r});
    b.qkv_cat = A(Pq * D * 4), b.qkv_w = A(Pq * D * 2), b.qkv_x = A(N * D * 2);
    b.qkv = A(N * Pq * 2);
    gemm_workspace(false, false);
    F({b.qkv_x, b.qkv_w, b.qkv_cat});
    rotary(b);
    if (first_layer) new_bounds(false);
    b.v = A(N * Hkv * hd * 2);
    b.o = A(N * Hq * hd * 2), b.lse = A(Hq * N * 4), b.r16 = A(kFlashRngStateBytes),
    b.r8 = A(kFlashRngPlaceholderBytes);
    F({b.lse, b.r16, b.r8, b.v});
    b.o_w = A(D * Hq * hd * 2), b.o_out = A(N * D * 2);
    F({b.o_w, b.o, b.krot, b.qrot, b.qkv});
    b.h = A(N * D * 4);
    F({b.o_out, b.n1});
    b.n2 = A(N * D * 4), b.n2r = A(N * 4);
    F({b.n2r});
    b.gu_cat = A(2 * Fm * D * 4), b.gu_w = A(2 * Fm * D * 2), b.gu_x = A(N * D * 2);
    b.gu = A(N * 2 * Fm * 2);
    F({b.gu_x, b.gu_w, b.gu_cat});
    b.silu = A(N * Fm * 2), b.mul = A(N * Fm * 2);
    b.d_w = A(Fm * D * 2), b.d_out = A(N * D * 2);
    F({b.d_w, b.mul, b.silu, b.gu});
    b.out = A(N * D * 4);
    F({b.d_out, b.n2, b.h});
    return b;
  }

  // One decoder block's backward (the varlen flash backward in the middle); as the ViT's.
  Id dec_block_backward(const DecBlock& b, Id G, Id xin, int64_t layer, bool ckpt,
                        std::vector<Id>& keep) {
    const auto pacc = [&](Id grad) { ckpt ? keep.push_back(grad) : acc(grad); };
    const Id g16 = A(N * D * 2);
    const Id dWd = A(Fm * D * 2);
    gemm_workspace(true, false);
    const Id dXd = A(N * Fm * 2);
    F({g16, b.d_w, b.mul});
    const Id dWd32 = A(Fm * D * 4);
    F({dWd});
    pacc(dWd32);
    const Id gup = A(N * Fm * 2), gsilu = A(N * Fm * 2);
    F({dXd, b.silu});
    const Id gs = A(N * Fm * 2);
    F({gsilu, b.gu});
    const Id ggu = A(N * 2 * Fm * 2);
    F({gs, gup});
    const Id dWgu = A(2 * Fm * D * 2), dX2 = A(N * D * 2);
    F({ggu, b.gu_w, b.gu_x});
    const Id dX2_32 = A(N * D * 4);
    F({dX2});
    const Id dWgu32 = A(2 * Fm * D * 4);
    F({dWgu});
    pacc(dWgu32);
    const Id dn2 = A(N * D * 4), dg2 = A(D * 4);
    F({dX2_32, b.h, b.n2r});
    Id R = G;
    if (ckpt) R = A(N * D * 4);  // summed out of place: the outer node holds the output's
    F({dn2});
    pacc(dg2);
    const Id g16a = A(N * D * 2);
    const Id dWo = A(D * D * 2), dXo = A(N * D * 2);
    F({g16a, b.o_w});
    const Id dWo32 = A(D * D * 4);
    F({dWo});
    pacc(dWo32);
    // FlashAttention's varlen backward (cuda_kernels.h).
    const Id dq = A(N * Hq * hd * 2), dk = A(N * Hkv * hd * 2), dv = A(N * Hkv * hd * 2);
    const Id sd = A(flash_varlen_softmax_d_bytes(N, S, Hq));
    const Id dqacc = A(flash_varlen_dq_accum_bytes(N, S, Hq, hd));
    if (Hq != Hkv) {  // GQA: dK and dV at the query heads, summed into dk, dv
      const Id dke = A(N * Hq * hd * 2), dve = A(N * Hq * hd * 2);
      F({dve, dke});
    }
    F({dqacc, sd, dXo, b.qrot, b.krot, b.v, b.o, b.lse, b.r16, b.r8});
    Id g1[2] = {-1, -1};
    for (const bool q : {false, true}) {  // k, then q
      const int64_t width = N * (q ? Hq : Hkv) * hd;
      const bool frees_tables = layer == 0 && q && !ckpt;
      g1[q] = A(width * 2);
      if (frees_tables) F({cos_b});
      const Id g2 = A(width * 2);
      F({q ? dq : dk});
      if (frees_tables) F({sin_b});
      const Id gn = A(width), gc = A(width * 2);
      F({g2, gn, gc});
    }
    const Id gqkv = A(N * Pq * 2);
    F({g1[1], g1[0], dv});
    const Id dWqkv = A(Pq * D * 2), dX1 = A(N * D * 2);
    F({gqkv, b.qkv_w, b.qkv_x});
    const Id dX1_32 = A(N * D * 4);
    F({dX1});
    const Id dWqkv32 = A(Pq * D * 4);
    F({dWqkv});
    pacc(dWqkv32);
    const Id dn1 = A(N * D * 4), dg1 = A(D * 4);
    if (ckpt) {
      F({dX1_32, b.n1r, dn1});
    } else {
      F({dX1_32, xin, b.n1r, dn1});
    }
    pacc(dg1);
    return R;
  }

  // --- one micro-step ---------------------------------------------------------------------
  void micro_step(const MicroBatchShape& mb, bool last_micro) {
    N = mb.tokens, S = mb.segments, L = mb.supervised, n = mb.crops, nP = n * P;
    const bool images = n > 0;  // a text-only micro-batch skips the image path entirely
    // The batch on the device (int32 copies converted to int64), the crops.
    Id ids = -1, pos = -1, lab = -1;
    for (Id* t : {&ids, &pos, &lab}) {
      const Id i32 = A(N * 4);
      *t = A(N * 8);
      F({i32});
    }
    const Id iti = A(n * Ti * 8), sup = A(L * 8), crops = A(n * 3 * img * img * 4);
    const Id emb = A(N * D * 4);
    std::vector<Id> cache;
    Id mp_w = kNone, mp_x = kNone, img32 = kNone, merged = emb;
    if (images) {
      cache = vit_forward();
      Id embeddings = kNone;
      if (freeze_v) {
        // The projector (pixel shuffle, a bias-free linear) after the frozen ViT.
        const Id shuffled = A(nP * d * 4);
        mp_w = A(D * d * ps * ps * 2), mp_x = A(nP * d * 2);
        embeddings = A(n * Ti * D * 2);
        F({mp_w});  // W.t() is a view: not saved when the input needs no gradient
        F({shuffled, lnf});
      } else if (chunks.size() == 1) {
        embeddings = chunks.front().mp_out;
      } else {  // the chunks' projections concatenated (torch::cat)
        embeddings = A(n * Ti * D * 2);
        for (const VitChunk& c : chunks) F({c.mp_out});
      }
      img32 = A(n * Ti * D * 4), merged = A(N * D * 4);
      F({embeddings, emb});
    }
    // RoPE tables, and their bf16 casts kept for every layer.
    const Id posf = A(N * 4), ang = A(N * hd / 2 * 4);
    F({posf});
    const Id rcat = A(N * hd * 4), cos = A(N * hd * 4), sin = A(N * hd * 4);
    F({rcat, ang});
    cos_b = A(N * hd * 2), sin_b = A(N * hd * 2);
    Id x = merged;
    dec.clear();
    dec_inputs.clear();
    for (int64_t l = 0; l < Ll; ++l) {
      dec_inputs.push_back(x);
      dec.push_back(ckpt_l ? dec_block_checkpointed(l == 0) : dec_block_grad(false, l == 0));
      x = dec.back().out;
    }
    // The final norm and the loss (model/token_loss.cpp) on the supervised rows.
    const Id nf = A(N * D * 4), nfr = A(N * 4);
    F({sin, cos});
    const Id ne = A(N), rows = A(L * D * 4), tgt = A(L * 8);
    const Id hsum = A(4);
    const ReduceStaging staging = reduce_staging(s.gpu_, 1, N * D, 4, true);
    if (staging.staging > 0) {
      const Id st = A(staging.staging), sem = A(staging.semaphores);
      F({sem, st});
    }
    const Id zero = A(4), count = A(8), count_cast = A(N * 8);
    F({count_cast});
    F({hsum});
    const Id hw = A(V * D * 2), rows_b = A(L * D * 2);
    const Id lg16 = A(L * V * 2), lg32 = A(L * V * 4);
    F({lg16});
    const Id lsm = A(L * V * 4), loss = A(4), tw = A(4);
    F({lg32, zero, rows, ne, nf, count});
    for (const Id c : cache) F({c});
    // The backward: the loss and the tied head.
    const Id obj = A(4), seed = A(4), gmul = A(4);
    const Id gnll = A(L * V * 4);
    F({gmul, tgt, tw});
    const Id glsm = A(L * V * 4);
    F({gnll, lsm});
    const Id glg16 = A(L * V * 2);
    F({glsm});
    const Id dhw = A(V * D * 2);
    gemm_workspace(true, false);
    const Id drows = A(L * D * 2);
    F({glg16, hw, rows_b});
    const Id drows32 = A(L * D * 4);
    F({drows});
    const Id dhw32 = A(V * D * 4);
    F({dhw});
    const Id gh = A(N * D * 4);
    F({drows32});
    const Id R = A(N * D * 4), nf_dg = A(D * 4);
    F({gh, x, nfr});
    acc(nf_dg);
    Id G = R;
    for (int64_t l = Ll; l-- > 0;) {
      std::vector<Id> keep;
      const size_t li = static_cast<size_t>(l);
      if (ckpt_l) {
        const DecBlock recomputed = dec_block_grad(true, l == Ll - 1);
        const Id next = dec_block_backward(recomputed, G, -1, l, true, keep);
        F({recomputed.out, G, dec_inputs[li]});
        for (const Id k : keep) acc(k);
        G = next;
      } else {
        G = dec_block_backward(dec[li], G, dec_inputs[li], l, false, keep);
      }
    }
    // index_copy's backward: the token embeddings' and the image embeddings' gradients (a
    // text-only micro-batch hands the residual gradient to the embedding as it is).
    const Id gtok = images ? A(N * D * 4) : G;
    if (images) image_backward(G, img32, mp_w, mp_x);
    embedding_backward(gtok, dhw32);
    F({seed});
    // The end of the micro-step (train/step_runner.cpp): the loss summed on the device.
    if (micro == 0) {
      F({obj});
      lsum = loss;
    } else {
      const Id sum = A(4);
      F({lsum, obj, loss});
      lsum = sum;
    }
    if (ckpt_l) F({sin_b, cos_b});
    F({sup, lab, iti, crops, pos, ids});
    if (last_micro) F({lsum});
    s.decoder_grads_ = true;
    if (images) s.image_grads_ = true;
    ++micro;
  }

  // From the residual gradient at the LM input: the image embeddings' gradient through the
  // projector and the ViT.
  void image_backward(Id G, Id img32, Id mp_w, Id mp_x) {
    const Id gimg = A(n * Ti * D * 4);
    F({G, img32});
    const Id gimg16 = A(n * Ti * D * 2);
    F({gimg});
    if (freeze_v) {
      const Id dWp = A(D * d * ps * ps * 2);
      F({gimg16, mp_x});
      const Id dWp32 = A(D * d * ps * ps * 4);
      F({dWp});
      acc_image(dWp32);
      return;
    }
    // The chunks last first: each parameter's gradient gathered over them (Place, join), the
    // shared casts' converted to fp32 once the first chunk, processed last, has added its own.
    const int64_t total = n;
    ImageGrads grads(static_cast<size_t>(vl));
    for (size_t k = chunks.size(); k-- > 0;) {
      const VitChunk& c = chunks[k];
      const Place place{chunks.size() - 1 - k, chunks.size()};
      set_chunk(c.crops);
      const Id dWp = A(D * d * ps * ps * 2), dXp = A(nP * d * 2);
      if (place.last()) F({gimg16});
      F({c.mp_w, c.mp_x});
      const Id dXp32 = A(nP * d * 4);
      F({dXp});
      const Id dWp32 = A(D * d * ps * ps * 4);
      F({dWp});
      join(grads.projector, dWp32, D * d * ps * ps * 4, place, true);
      if (place.last()) acc_image(grads.projector);
      const Id gps = A(nP * d * 4);
      F({dXp32});
      const Id RV = A(nP * d * 4), lnf_dg = A(d * 4), lnf_db = A(d * 4);
      F({gps, c.vit_last, c.lnfm, c.lnfr});
      join(grads.lnf_g, lnf_dg, d * 4, place, false);
      join(grads.lnf_b, lnf_db, d * 4, place, false);
      if (place.last()) {
        acc_image(grads.lnf_g);
        acc_image(grads.lnf_b);
      }
      G = RV;
      for (int64_t l = vl; l-- > 0;) {
        const size_t li = static_cast<size_t>(l);
        const Id xin = l == 0 ? c.x_v0 : c.blocks[li - 1].out;
        std::vector<Id> keep;
        if (ckpt_v) {
          const VitBlock recomputed = vit_block_grad(true);
          for (const Id cached : recomputed.cached) F({cached});
          const Id next =
              vit_block_backward(recomputed, G, -1, true, keep, place, grads.blocks[li]);
          F({recomputed.out, G, xin});
          for (const Id kept : keep) acc_image(kept);
          G = next;
        } else {
          G = vit_block_backward(c.blocks[li], G, xin, false, keep, place, grads.blocks[li]);
        }
      }
      // The patch embedding: the positions' gradient, the kernel's (a view, cast per chunk) and
      // the bias's (a cached cast).
      // With one crop the positions' gradient (a sum over the crops) is a view of the residual
      // gradient: nothing allocated, and the residual gradient stays as long as it is buffered.
      const Id pe_g16 = A(nP * d * 2);
      Id pe_gpos = G;
      if (n > 1) {
        pe_gpos = A(P * d * 4);
        F({G});
      } else if (place.first()) {
        grads.positions_shared = true;
      }
      join(grads.positions, pe_gpos, P * d * 4, place, false);
      if (place.last()) {
        // AccumulateGrad cannot take over a shared gradient as the .grad: it clones it.
        if (grads.positions_shared && !s.image_grads_) {
          A(P * d * 4);
          F({grads.positions});
        } else {
          acc_image(grads.positions);
        }
      }
      const Id pe_dW = A(d * K * 2), pe_db = A(d * 2);
      const ReduceStaging pe_staging = reduce_staging(s.gpu_, d, nP, 2, false);
      if (pe_staging.staging > 0) {
        const Id st = A(pe_staging.staging), sem = A(pe_staging.semaphores);
        F({sem, st});
      }
      F({pe_g16, c.pe_x});
      join(grads.pe_b, pe_db, d * 2, place, true);
      const Id pe_dW32 = A(d * K * 4);
      F({pe_dW});
      if (place.last()) convert(grads.pe_b, d * 4);
      join(grads.pe_w, pe_dW32, d * K * 4, place, true);
      if (place.last()) acc_image(grads.pe_w);
    }
    set_chunk(total);
  }

  // EmbeddingBackward0 (aten/src/ATen/native/cuda/Embedding.cu) from the token embeddings'
  // gradient: the sort path above 3,072 indices, then the tied head's gradient summed into it.
  void embedding_backward(Id gtok, Id dhw32) {
    Id eb_gw = -1;
    if (N > kEmbeddingSortThreshold) {
      const Id sorted = A(N * 8), orig = A(N * 8), range = A(N * 8);
      const Id cub1 = A(embedding_sort_scratch_bytes(N));
      F({cub1, range});
      eb_gw = A(V * D * 4);
      const Id segoff = A(N * 8), nseg = A(8), t1 = A(N * 8);
      const Id cub2 = A(kEmbeddingCubScratchBytes);
      F({cub2, t1});
      const Id pps = A(N * 8), ppso = A(N * 8);
      const Id cub3 = A(kEmbeddingCubScratchBytes);
      F({cub3});
      const Id npseg = A(8);
      const int64_t partial_segments = N / 10 + N;
      const Id pso = A(partial_segments * 8), gwps = A(partial_segments * D * 4);
      F({gwps, pso, npseg, ppso, pps, nseg, segoff, orig, sorted});
    } else {
      eb_gw = A(V * D * 4);
    }
    F({gtok});
    const Id eb_sum = A(V * D * 4);
    F({dhw32, eb_gw});
    acc(eb_sum);
  }

  // The gradient all-reduce over several ranks (runtime/distributed.cpp all_reduce_gradients):
  // a parameter without a gradient on this rank gets zeros (they stay as its .grad); the
  // gradients in the optimizer's order cut into buckets that close at kGradientBucketBytes, a
  // bucket of several flattened by cat, two in flight. Derived from the code: no multi-GPU trace
  // has been recorded (NCCL's stream may hold a finished bucket's block a little longer).
  void all_reduce() {
    if (!s.image_grads_) {
      const OptimizerOrder image = optimizer_order(s.spec_, true);
      const size_t image_tensors =
          image.elements.size() - optimizer_order(s.spec_, false).elements.size();
      for (size_t i = 0; i < image_tensors; ++i) A(4 * image.elements[i]);
      s.image_grads_ = true;
    }
    const OptimizerOrder order = optimizer_order(s.spec_, true);
    std::vector<int64_t> flattened;
    int64_t bytes = 0, tensors = 0;
    for (const int64_t elements : order.elements) {
      bytes += 4 * elements;
      ++tensors;
      if (bytes >= kGradientBucketBytes) {
        flattened.push_back(tensors > 1 ? bytes : 0);
        bytes = tensors = 0;
      }
    }
    if (tensors > 0) flattened.push_back(tensors > 1 ? bytes : 0);
    std::vector<Id> in_flight;
    for (const int64_t flat : flattened) {
      if (in_flight.size() == 2) {
        F({in_flight.front()});
        in_flight.erase(in_flight.begin());
      }
      in_flight.push_back(A(flat));
    }
    for (const Id flat : in_flight) F({flat});
  }

  // clip_grad_norm then the fused AdamW, one call per group (train/optimizer.cpp), over the
  // parameters that have a gradient: AdamW creates a parameter's moments at its first update.
  void optimizer() {
    const OptimizerOrder order = optimizer_order(s.spec_, s.image_grads_);
    const int64_t T = static_cast<int64_t>(order.elements.size());
    const Id partials = A(foreach_norm_partials_bytes(T, order.largest));
    std::vector<Id> norms;
    for (int64_t i = 0; i < T; ++i) norms.push_back(A(4));
    F({partials});
    const Id stack = A(4 * T), total = A(4);
    F({total, stack});
    for (const Id norm : norms) F({norm});
    size_t next = 0, group = 0;
    const size_t image_groups = order.group_sizes.size() - order.decoder_groups;
    for (const size_t size : order.group_sizes) {
      const bool first = group++ < image_groups ? !s.image_moments_ : !s.decoder_moments_;
      Id step_count = -1;
      for (size_t k = 0; k < size; ++k, ++next) {
        if (first) {
          A(4 * order.elements[next]);  // exp_avg
          A(4 * order.elements[next]);  // exp_avg_sq
        }
        if (k == 0) step_count = A(4);
      }
      F({step_count});
    }
  }
};

StepStream::StepStream(const MemorySpec& spec, GpuShape gpu) : spec_(spec), gpu_(gpu) {
  if (const std::string why = unmodelled(spec); !why.empty()) throw std::invalid_argument(why);
}

int32_t StepStream::alloc(int64_t bytes) {
  const auto id = static_cast<int32_t>(live_.size());
  live_.push_back(1);
  requests_.push_back({bytes, id});
  return id;
}

void StepStream::free(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= live_.size() || !live_[static_cast<size_t>(id)]) {
    throw std::logic_error("cuda::StepStream: free of a request that is not live");
  }
  live_[static_cast<size_t>(id)] = 0;
  requests_.push_back({0, id});
}

void StepStream::model_states() {
  // The communicator, created before the model, holds a 4-byte flag and 64 doubles on the
  // device over several ranks (runtime/distributed.cpp).
  if (spec_.ranks > 1) {
    alloc(4);
    alloc(8 * 64);
  }
  for (const ParameterTensor& t : parameter_tensors(spec_)) alloc(t.bytes());
}

bool StepStream::chunks_loss(const MicroBatchShape& micro) const {
  const int64_t chunk = spec_.levers.loss_chunk_tokens;
  return chunk > 0 && micro.supervised > chunk;
}

void StepStream::step(const std::vector<MicroBatchShape>& micro_batches) {
  Impl walk(*this);
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    walk.micro_step(micro_batches[k], k + 1 == micro_batches.size());
  }
  if (spec_.ranks > 1) walk.all_reduce();
  walk.optimizer();
  decoder_moments_ = true;
  image_moments_ = image_moments_ || image_grads_;
}

void StepStream::optimizer_states() {
  for (const bool image : {true, false}) {
    const OptimizerOrder order = optimizer_order(spec_, true);
    size_t next = 0;
    const size_t image_tensors = [&] {
      size_t count = 0;
      for (size_t g = 0; g + order.decoder_groups < order.group_sizes.size(); ++g) {
        count += order.group_sizes[g];
      }
      return count;
    }();
    for (const int64_t elements : order.elements) {
      if ((next++ < image_tensors) == image) {
        alloc(4 * elements);
        alloc(4 * elements);
      }
    }
  }
  decoder_moments_ = image_moments_ = true;
}

void StepStream::backward_passes(const std::vector<MicroBatchShape>& micro_batches) {
  Impl walk(*this);
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    walk.micro_step(micro_batches[k], k + 1 == micro_batches.size());
  }
}

StreamPeaks replay_peaks(const std::vector<Request>& requests, size_t from, size_t to) {
  CudaCachingAllocatorModel allocator;
  std::vector<uint64_t> address;
  address.reserve(requests.size());
  const auto apply = [&](const Request& r) {
    const auto id = static_cast<size_t>(r.id);
    if (r.bytes > 0) {
      if (address.size() <= id) address.resize(id + 1, 0);
      address[id] = allocator.allocate(r.bytes);
    } else {
      allocator.free(address[id]);
    }
  };
  for (size_t i = 0; i < from && i < requests.size(); ++i) apply(requests[i]);
  StreamPeaks peaks;
  peaks.allocated_before = allocator.allocated_bytes();
  peaks.reserved_before = allocator.reserved_bytes();
  allocator.reset_peaks();
  for (size_t i = from; i < to && i < requests.size(); ++i) apply(requests[i]);
  peaks.allocated = allocator.peak_allocated_bytes();
  peaks.reserved = allocator.peak_reserved_bytes();
  return peaks;
}

std::string unmodelled_on(const MemorySpec& spec, const DeviceTarget& target) {
  if (!target.cuda) return "not a CUDA target";
  if (!target.torch.at_least(2, 11)) {
    return "LibTorch " + target.torch.str() +
           "'s CUDA kernels are not replayed (the replay follows LibTorch 2.11's)";
  }
  if (!target.gpu.nvidia || target.gpu.compute_capability < 80) {
    return "the GPU " + target.gpu.name +
           " (FlashAttention needs an NVIDIA GPU of compute "
           "capability 8.0 or more; its kernels are not replayed)";
  }
  if (target.gpu.multiprocessors <= 0) {
    return "the GPU " + target.gpu.name +
           " is not in the catalog (its SM count sizes the "
           "reduction kernels' buffers)";
  }
  return unmodelled(spec);
}

std::optional<DeviceBreakdown> replayed_step(const MemorySpec& spec,
                                             const std::vector<BatchShape>& micro_batches,
                                             StepState before, const DeviceTarget& target,
                                             const DeviceCorrections& corrections) {
  if (micro_batches.empty() || !unmodelled_on(spec, target).empty()) return std::nullopt;
  GpuShape gpu;
  gpu.sms = target.gpu.multiprocessors;
  gpu.sm90 = target.gpu.compute_capability == 90;
  std::vector<MicroBatchShape> step, warm_up;
  for (const BatchShape& b : micro_batches) {
    const MicroBatchShape m{b.rows * b.row_tokens, b.segments, b.supervised_tokens, b.crops};
    if (m.supervised <= 0) return std::nullopt;
    step.push_back(m);
    warm_up.push_back(m);
    if (before.image_gradients_pending) warm_up.back().crops = 0;
  }
  StepStream stream(spec, gpu);
  for (const MicroBatchShape& m : step) {
    if (stream.chunks_loss(m)) return std::nullopt;
  }
  stream.model_states();
  if (before.gradients && before.moments) {
    stream.step(warm_up);
  } else if (before.gradients) {
    stream.backward_passes(warm_up);
  } else if (before.moments) {
    stream.optimizer_states();
  }
  const size_t from = stream.requests().size();
  stream.step(step);
  const StreamPeaks peaks = replay_peaks(stream.requests(), from, stream.requests().size());
  DeviceBreakdown b;
  b.cuda = true;
  b.replayed = true;
  b.tensors = peaks.allocated;
  b.static_tensors = peaks.allocated_before;
  b.allocated = peaks.allocated;
  b.reserved = peaks.reserved;
  b.segment_slack = peaks.reserved - peaks.allocated;
  b.cuda_context = corrections.cuda_context_bytes;
  if (target.ranks > 1) {
    b.nccl_buffers =
        target.nccl_channels * 2 * (target.nccl_buffsize + kNcclLlBuffSize + kNcclLl128BuffSize);
  }
  b.device = b.reserved + b.cuda_context + b.nccl_buffers;
  return b;
}

}  // namespace vlm::memory::cuda
