// The configuration of a vlmtrain run: one typed schema.
//
// Priority: struct defaults < model preset < config file < --set overrides. Each section
// declares its fields exactly once in `visit_fields`, with the YAML key, a one-line doc and
// the allowed values; `vlmtrain config --schema` lists them and docs/config.md explains them.
// Relative paths are relative to the working directory the tool is started from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config_schema.h"
#include "spec/model_spec.h"

namespace vlm {

// --- model ------------------------------------------------------------------------------

// The model's memory levers (the model.* keys below; their docs are in visit_fields). The model
// layer is built from this struct as it is, and the memory model reads the same fields: one
// source for each setting.
struct ModelLevers {
  // Activation checkpointing per block: keep only each block's input, recompute the block in
  // backward (one extra forward of that module).
  bool checkpoint_vision = false;
  bool checkpoint_language = false;
  // Run the ViT (and projector) over at most this many crops at a time; 0 = all at once.
  // Bounds the transient attention/MLP peak of the ViT, not what is saved for backward.
  int64_t vision_chunk_crops = 0;
  // Frozen modules get requires_grad = false (no gradients, no optimizer state).
  bool freeze_vision = false;
  bool freeze_projector = false;
  bool freeze_language = false;
  // "bf16": frozen modules' parameters are stored in bf16 (half their bytes); buffers stay fp32.
  std::string frozen_dtype = "fp32";
  // Compute the loss over at most this many supervised tokens at a time, each chunk
  // checkpointed so that only one chunk's logits ([chunk, vocab] fp32) exist at once;
  // 0 = all supervised tokens in one piece.
  int64_t loss_chunk_tokens = 0;
  // How the decoder's block-diagonal causal attention runs (model/packed_attention.h): auto,
  // varlen (one FlashAttention call over all segments, CUDA), grouped, per_segment.
  std::string attention = "auto";

  bool frozen_in_bf16() const { return frozen_dtype == "bf16"; }
};

struct ModelConfig : ModelLevers {
  spec::ModelSpec dims = spec::preset("tiny");  // `preset` and the vision/projector/language dims
  std::string tokenizer = "builtin:bytes";
  std::string weights;           // a full VLM safetensors (nanoVLM names) to start from
  std::string vision_weights;    // HF SigLIP/SigLIP2 safetensors for the vision encoder
  std::string language_weights;  // HF SmolLM2/Llama safetensors (or .index.json) for the LM
};

template <class V>
void visit_fields(V& v, spec::VisionSpec& c) {
  v.field(c.image_size, "image_size",
          "Crop side in pixels: the ViT input (images are split into crops of this size).",
          IntRange{8, 4096});
  v.field(c.patch_size, "patch_size", "ViT patch side in pixels; must divide image_size.",
          IntRange{1, 1024});
  v.field(c.hidden_size, "hidden_size", "ViT width.", IntRange{8, 65536});
  v.field(c.num_layers, "num_layers", "ViT blocks.", IntRange{1, 1024});
  v.field(c.num_heads, "num_heads", "ViT attention heads; must divide hidden_size.",
          IntRange{1, 1024});
  v.field(c.mlp_size, "mlp_size", "ViT MLP width.", IntRange{1, 1 << 20});
  v.field(c.layer_norm_eps, "layer_norm_eps", "LayerNorm epsilon.", RealRange{0, 1, true});
}

template <class V>
void visit_fields(V& v, spec::ProjectorSpec& c) {
  v.field(
      c.pixel_shuffle, "pixel_shuffle",
      "Pixel-shuffle factor: image tokens per crop = (image_size/patch_size)^2 / pixel_shuffle^2.",
      IntRange{1, 64});
}

template <class V>
void visit_fields(V& v, spec::LanguageSpec& c) {
  v.field(c.hidden_size, "hidden_size", "Decoder width.", IntRange{8, 1 << 17});
  v.field(c.num_layers, "num_layers", "Decoder blocks.", IntRange{1, 1024});
  v.field(c.num_heads, "num_heads", "Query heads; must divide hidden_size.", IntRange{1, 1024});
  v.field(c.num_kv_heads, "num_kv_heads",
          "Key/value heads (grouped-query attention); must divide num_heads.", IntRange{1, 1024});
  v.field(c.mlp_size, "mlp_size", "SwiGLU MLP width.", IntRange{1, 1 << 20});
  v.field(c.vocab_size, "vocab_size", "Base vocabulary of the tokenizer.", IntRange{2, 1 << 24});
  v.field(c.extra_tokens, "extra_tokens",
          "Embedding rows after the base vocabulary (image-placement tokens).",
          IntRange{0, 1 << 20});
  v.field(c.rope_base, "rope_base", "RoPE theta.", RealRange{0, 1e12, true});
  v.field(c.rms_norm_eps, "rms_norm_eps", "RMSNorm epsilon.", RealRange{0, 1, true});
  v.field(c.max_position, "max_position",
          "Longest position the model supports; must be >= packing.max_seq_len.",
          IntRange{1, 1 << 24});
  v.field(c.tie_embeddings, "tie_embeddings", "Share the input embedding with the output head.");
}

template <class V>
void visit_fields(V& v, ModelConfig& c) {
  v.field(c.dims.preset, "preset",
          "Model preset; its dimensions apply before the file's own model.* keys.",
          Choices{spec::preset_names()});
  v.section(c.dims.vision, "vision", "Vision encoder (SigLIP-style ViT) dimensions.");
  v.section(c.dims.projector, "projector", "Modality projector (pixel shuffle + linear).");
  v.section(c.dims.language, "language",
            "Language model (Llama/SmolLM2-style decoder) dimensions.");
  v.field(c.tokenizer, "tokenizer",
          "Path of a Hugging Face tokenizer.json (byte-level BPE), or builtin:bytes.");
  v.field(c.weights, "weights",
          "Full VLM weights (safetensors with nanoVLM names) to start from; empty = random init.");
  v.field(c.vision_weights, "vision_weights",
          "Vision encoder weights in Hugging Face SigLIP/SigLIP2 names; empty = none.");
  v.field(c.language_weights, "language_weights",
          "Language model weights in Hugging Face SmolLM2/Llama names (.safetensors or "
          ".index.json); empty = none.");
  v.field(c.checkpoint_vision, "checkpoint_vision",
          "Activation checkpointing for every ViT block.");
  v.field(c.checkpoint_language, "checkpoint_language",
          "Activation checkpointing for every decoder block.");
  v.field(c.vision_chunk_crops, "vision_chunk_crops",
          "Run the ViT over at most this many crops at a time (bounds its activation peak); 0 = "
          "all at once.",
          IntRange{0, 1 << 20});
  v.field(c.freeze_vision, "freeze_vision", "Do not train the vision encoder.");
  v.field(c.freeze_projector, "freeze_projector", "Do not train the projector.");
  v.field(c.freeze_language, "freeze_language", "Do not train the language model.");
  v.field(c.frozen_dtype, "frozen_dtype", "Storage dtype of frozen modules.",
          Choices{{"fp32", "bf16"}});
  v.field(c.loss_chunk_tokens, "loss_chunk_tokens",
          "Compute the loss over at most this many supervised tokens at a time (bounds the logits' "
          "memory); 0 = all at once.",
          IntRange{0, 1 << 24});
  v.field(c.attention, "attention",
          "How the decoder attends within each packed sample: auto (varlen on CUDA in bf16/fp16 "
          "on sm80+, else grouped; per_segment on LibTorch 1.13), varlen (one FlashAttention "
          "call over every sample of the micro-batch), grouped (samples of similar length "
          "padded into batches), per_segment (one masked call per sample).",
          Choices{{"auto", "varlen", "grouped", "per_segment"}});
}

// --- data -------------------------------------------------------------------------------

struct DatasetConfig {
  std::string path;
  double weight = 1.0;
  std::string format = "auto";
};

template <class V>
void visit_fields(V& v, DatasetConfig& c) {
  v.field(c.path, "path",
          "JSONL manifest (image paths relative to it), or WebDataset tar shards: a brace "
          "pattern (train-{000000..000127}.tar), a folder of .tar files, one .tar, or a list "
          "file of shards (docs/data.md).");
  v.field(c.weight, "weight", "Sampling weight when several datasets are mixed.",
          RealRange{0, 1e9, true});
  v.field(c.format, "format",
          "Manifest style (the_cauldron, llava, or detected per line), or webdataset: tar "
          "shards (auto takes a folder, a .tar or a brace pattern as shards).",
          Choices{{"auto", "cauldron", "llava", "webdataset"}});
}

struct DataConfig {
  std::vector<DatasetConfig> train;
  std::vector<DatasetConfig> validation;
  int64_t max_img_size = 2048;
  bool resize_to_max = false;
  bool allow_upscale = false;
  std::vector<double> image_mean{0.5, 0.5, 0.5};
  std::vector<double> image_std{0.5, 0.5, 0.5};
  int64_t max_images_per_example = 4;
  int64_t max_sample_length = 4096;
  int64_t workers = 2;
  int64_t prefetch_batches = 4;
  double max_skipped_fraction = 0.01;
  int64_t min_skipped_for_error = 100;
};

template <class V>
void visit_fields(V& v, DataConfig& c) {
  v.list(c.train, "train",
         "Training datasets (list of {path, weight, format}): manifests or shards.");
  v.list(c.validation, "validation", "Held-out datasets for evaluation (same form).");
  v.field(c.max_img_size, "max_img_size",
          "Longest image side after resizing, in pixels; a multiple of model.vision.image_size.",
          IntRange{1, 1 << 16});
  v.field(c.resize_to_max, "resize_to_max",
          "Always scale the long side to max_img_size (nanoVLM's behaviour), even upwards.");
  v.field(c.allow_upscale, "allow_upscale",
          "Allow images smaller than max_img_size to be scaled up.");
  v.field(c.image_mean, "image_mean", "Per-channel mean for normalisation (RGB, in [0,1]).",
          RealRange{-10, 10});
  v.field(c.image_std, "image_std", "Per-channel std for normalisation (RGB).",
          RealRange{0, 10, true});
  v.field(c.max_images_per_example, "max_images_per_example",
          "Samples with more images are dropped (counted).", IntRange{0, 1024});
  v.field(c.max_sample_length, "max_sample_length",
          "Samples with more LM tokens (image tokens included) are dropped (counted).",
          IntRange{1, 1 << 24});
  v.field(c.workers, "workers", "Image decoding threads per rank.", IntRange{0, 256});
  v.field(c.prefetch_batches, "prefetch_batches",
          "Micro-batches decoded ahead (bounds host memory).", IntRange{1, 1024});
  v.field(c.max_skipped_fraction, "max_skipped_fraction",
          "Error out when more than this fraction of samples is skipped as malformed.",
          RealRange{0, 1});
  v.field(c.min_skipped_for_error, "min_skipped_for_error",
          "...but only once at least this many were skipped.", IntRange{0, INT64_MAX});
}

// --- packing ----------------------------------------------------------------------------

struct PackingConfig {
  int64_t max_seq_len = 4096;
  int64_t max_images_per_knapsack = 18;
  int64_t max_crops_per_pack = 0;
  int64_t buffer_samples = 1024;
  int64_t max_deferrals = 2;
  int64_t emission_window = 64;
};

template <class V>
void visit_fields(V& v, PackingConfig& c) {
  v.field(c.max_seq_len, "max_seq_len", "LM tokens per packed row.", IntRange{16, 1 << 24});
  v.field(c.max_images_per_knapsack, "max_images_per_knapsack", "Images per packed row.",
          IntRange{0, 1 << 16});
  v.field(c.max_crops_per_pack, "max_crops_per_pack", "ViT crops per packed row; 0 = no cap.",
          IntRange{0, 1 << 20});
  v.field(c.buffer_samples, "buffer_samples",
          "Samples the packer considers at once (best-fit window).", IntRange{1, 1 << 24});
  v.field(c.max_deferrals, "max_deferrals",
          "Rounds an under-filled pack may wait for more samples before it is emitted.",
          IntRange{0, 64});
  v.field(c.emission_window, "emission_window",
          "Packs shuffled together before emission (so they are not sorted by length).",
          IntRange{1, 1 << 20});
}

// --- train ------------------------------------------------------------------------------

struct LearningRates {
  double projector = 2e-3;
  double vision = 5e-5;
  double language = 5e-5;
};

template <class V>
void visit_fields(V& v, LearningRates& c) {
  v.field(c.projector, "projector", "Peak learning rate of the projector.", RealRange{0, 10});
  v.field(c.vision, "vision", "Peak learning rate of the vision encoder.", RealRange{0, 10});
  v.field(c.language, "language", "Peak learning rate of the language model.", RealRange{0, 10});
}

// The most packs one optimizer step may hold over all ranks (ranks x gradient_accumulation_steps
// x batch_size, or global_batch_size with batch_size auto): 65,536 packs of 4,096 tokens are
// 268M tokens a step, 16x the largest published LLM batches. Every rank plans every rank's
// micro-batches, at about 3,500 packs/s on one core (docs/limits.md), so the limit keeps a
// plan to seconds.
inline constexpr int64_t kMaxPacksPerStep = 65536;

struct TrainConfig {
  int64_t batch_size = 4;  // 0: auto (micro-batches sized by the memory budget)
  int64_t gradient_accumulation_steps = 1;
  int64_t global_batch_size = 0;  // packs per step over all ranks, with batch_size auto
  bool batch_size_auto() const { return batch_size == 0; }
  // The rows of the heaviest micro-batch the data limits allow on their own: batch_size, or
  // with auto a single pack (the memory budget bounds every micro-batch of more).
  int64_t rows_by_limits() const { return batch_size_auto() ? 1 : batch_size; }
  int64_t max_crops_per_micro_batch = 0;
  int64_t max_steps = 1000;
  LearningRates lr;
  std::string schedule = "cosine";
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;
  bool fused_optimizer = true;
  std::string precision = "bf16";
  int64_t seed = 0;
  int64_t eval_every = 0;
  int64_t eval_generate = 16;
  int64_t max_new_tokens = 16;
  int64_t max_nonfinite_steps = 5;
  bool preflight = true;
  int64_t threads = 0;
  std::string device = "auto";
};

template <class V>
void visit_fields(V& v, TrainConfig& c) {
  v.field(c.batch_size, "batch_size",
          "Packs per micro-batch on each rank, at most (the memory budget may take fewer); "
          "auto: as many as fit the memory budget, micro-steps as many as the step's "
          "global_batch_size packs need (docs/sampler.md).",
          IntRange{1, 65536, "auto"});
  v.field(c.gradient_accumulation_steps, "gradient_accumulation_steps",
          "Micro-batches per optimizer step on each rank (a fixed batch_size only).",
          IntRange{1, 65536});
  v.field(c.global_batch_size, "global_batch_size",
          "Packs per optimizer step over all ranks, with batch_size auto (required there); "
          "with a fixed batch_size it is batch_size x gradient_accumulation_steps x ranks.",
          IntRange{0, kMaxPacksPerStep});
  v.field(c.max_crops_per_micro_batch, "max_crops_per_micro_batch",
          "ViT crops per micro-batch; 0 = no cap.", IntRange{0, 1 << 24});
  v.field(c.max_steps, "max_steps", "Optimizer steps to train.", IntRange{1, INT64_MAX});
  v.section(c.lr, "lr", "Peak learning rates per module.");
  v.field(c.schedule, "schedule", "Learning-rate schedule after warmup.",
          Choices{{"cosine", "linear", "constant"}});
  v.field(c.warmup_steps, "warmup_steps", "Linear warmup steps from 0 to the peak rate.",
          IntRange{0, INT64_MAX});
  v.field(c.min_lr_ratio, "min_lr_ratio", "Floor of the decay as a fraction of the peak rate.",
          RealRange{0, 1});
  v.field(c.weight_decay, "weight_decay",
          "AdamW weight decay (never applied to norms, biases, embeddings).", RealRange{0, 10});
  v.field(c.adam_beta1, "adam_beta1", "AdamW beta1.", RealRange{0, 1});
  v.field(c.adam_beta2, "adam_beta2", "AdamW beta2.", RealRange{0, 1});
  v.field(c.adam_eps, "adam_eps", "AdamW epsilon.", RealRange{0, 1, true});
  v.field(c.grad_clip, "grad_clip", "Clip the global gradient norm to this; 0 = off.",
          RealRange{0, 1e9});
  v.field(c.fused_optimizer, "fused_optimizer",
          "On CUDA with LibTorch >= 2.1, AdamW as one fused kernel per parameter group "
          "(the same update up to rounding); false, or on CPU: LibTorch's AdamW, kernels per "
          "parameter.");
  v.field(c.precision, "precision", "Compute precision (master weights stay fp32).",
          Choices{{"bf16", "fp16", "fp32"}});
  v.field(c.seed, "seed", "Seed of initialisation, data order and packing.",
          IntRange{0, INT64_MAX});
  v.field(c.eval_every, "eval_every", "Validation every N steps; 0 = only at the end.",
          IntRange{0, INT64_MAX});
  v.field(c.eval_generate, "eval_generate",
          "Validation questions answered by greedy generation at each evaluation (exact-match "
          "accuracy); all of them at the end of training.",
          IntRange{0, 1 << 20});
  v.field(c.max_new_tokens, "max_new_tokens", "Longest generated answer, in tokens.",
          IntRange{1, 4096});
  v.field(c.preflight, "preflight",
          "Before the first step, run the heaviest micro-batch the config allows and stop with "
          "what would fit if it does not (CUDA, or a CPU run with memory.simulate_device_bytes).");
  v.field(c.max_nonfinite_steps, "max_nonfinite_steps",
          "Consecutive steps with a non-finite loss or gradient (skipped) before the run fails.",
          IntRange{1, 1 << 20});
  v.field(c.threads, "threads", "CPU threads for LibTorch; 0 = this rank's share: SLURM_CPUS_PER_TASK, else the "
          "cores it may use divided among torchrun's local ranks (docs/gpu.md).", IntRange{0, 4096});
  v.field(c.device, "device", "Where to train: auto (CUDA when available), cpu or cuda.",
          Choices{{"auto", "cpu", "cuda"}});
}

// --- memory -----------------------------------------------------------------------------

struct MemoryConfig {
  std::string device_memory = "auto";
  double safety_margin = 0.1;
  ByteSize simulate_device_bytes;
  std::string calibration;
};

template <class V>
void visit_fields(V& v, MemoryConfig& c) {
  v.field(c.device_memory, "device_memory",
          "Memory budget per device: auto (what the device reports), a size (\"80GiB\") or a GPU "
          "name (\"H100-80GB\").");
  v.field(c.safety_margin, "safety_margin",
          "Fraction of the budget kept free for fragmentation and workspace.", RealRange{0, 0.9});
  v.field(c.simulate_device_bytes, "simulate_device_bytes",
          "Run as on a device of this size, to exercise OOM recovery or plan for a smaller GPU: "
          "CPU, the tracking allocator's cap; CUDA, the caching allocator's memory fraction "
          "(this size less what the device holds outside it). Also the memory budget under "
          "device_memory auto. 0 = off.");
  v.field(c.calibration, "calibration",
          "Memory calibration file (vlmtrain calibrate-memory, docs/memory-device.md): fitted "
          "corrections of the device terms for this device and LibTorch; empty = the defaults.");
}

// --- distributed ------------------------------------------------------------------------

struct DistributedConfig {
  std::string backend = "auto";
  int64_t timeout_s = 600;
};

template <class V>
void visit_fields(V& v, DistributedConfig& c) {
  v.field(c.backend, "backend",
          "Collective backend: auto (NCCL on CUDA, Gloo on CPU), nccl or gloo.",
          Choices{{"auto", "nccl", "gloo"}});
  v.field(c.timeout_s, "timeout_s",
          "A collective that waits longer than this fails the run instead of hanging.",
          IntRange{1, 86400 * 7});
}

// --- output -----------------------------------------------------------------------------

struct OutputConfig {
  std::string dir = "runs/default";
  int64_t checkpoint_every = 0;
  int64_t keep_checkpoints = 2;
  std::string resume = "auto";
  bool sample_ledger = false;
  bool tensorboard = true;
  int64_t memory_trace_steps = 0;
  int64_t profile_steps = 0;
  int64_t profile_warmup_steps = 3;
};

template <class V>
void visit_fields(V& v, OutputConfig& c) {
  v.field(c.dir, "dir", "Run directory: resolved config, metrics.jsonl, checkpoints.");
  v.field(c.checkpoint_every, "checkpoint_every",
          "Save every N steps (and always at the end); 0 = only at the end.",
          IntRange{0, INT64_MAX});
  v.field(c.keep_checkpoints, "keep_checkpoints",
          "Complete checkpoints kept; older ones are deleted.", IntRange{1, 1 << 20});
  v.field(c.resume, "resume",
          "auto: continue from the newest complete checkpoint in dir; never: start fresh.",
          Choices{{"auto", "never"}});
  v.field(c.sample_ledger, "sample_ledger",
          "Write RUN_DIR/samples.jsonl: the ids (stream positions) of every step's samples, all "
          "ranks, to audit that each sample is trained exactly once across restarts.");
  v.field(c.tensorboard, "tensorboard",
          "Write the scalars of metrics.jsonl as training goes into a TensorBoard event file in "
          "the run directory (events.out.tfevents.*.vlmtrain; `tensorboard --logdir RUN_DIR`); "
          "docs/report.md.");
  v.field(c.memory_trace_steps, "memory_trace_steps",
          "Record every allocation and free of the first N steps of this run, with the op that "
          "made it, into RUN_DIR/memory-trace.rankR.txt (CPU: the tracking allocator; CUDA: the "
          "caching allocator's trace); docs/memory-trace.md. 0 = off.",
          IntRange{0, 1 << 20});
  v.field(c.profile_steps, "profile_steps",
          "Profile N steps (LibTorch >= 2.1, Kineto) after profile_warmup_steps steps of this "
          "run: RUN_DIR/profile.rankR.json (Chrome trace) and profile-summary.rankR.json (per "
          "step: device busy and idle time, kernels; the top kernels); docs/profiling.md. "
          "0 = off.",
          IntRange{0, 1 << 20});
  v.field(c.profile_warmup_steps, "profile_warmup_steps",
          "Steps of this run before profiling starts (the first steps load kernels and fill "
          "the allocator's cache).",
          IntRange{0, 1 << 20});
}

// --- log --------------------------------------------------------------------------------

struct LogConfig {
  std::string level = "info";
  int64_t every_steps = 10;
  std::string color = "auto";
  bool all_ranks = false;
};

template <class V>
void visit_fields(V& v, LogConfig& c) {
  v.field(c.level, "level", "Log level of rank 0.",
          Choices{{"trace", "debug", "info", "warn", "error", "off"}});
  v.field(c.every_steps, "every_steps",
          "Progress line every N steps when stderr is not a terminal.", IntRange{1, INT64_MAX});
  v.field(c.color, "color",
          "Coloured logs: auto (only on a terminal and without NO_COLOR), always or never.",
          Choices{{"auto", "always", "never"}});
  v.field(c.all_ranks, "all_ranks",
          "Log every rank at `level` (otherwise ranks > 0 log warnings only).");
}

// --- the whole ----------------------------------------------------------------------------

struct Config {
  ModelConfig model;
  DataConfig data;
  PackingConfig packing;
  TrainConfig train;
  MemoryConfig memory;
  DistributedConfig distributed;
  OutputConfig output;
  LogConfig log;
};

template <class V>
void visit_fields(V& v, Config& c) {
  v.section(c.model, "model", "The model: preset, dimensions, weights, memory levers.");
  v.section(c.data, "data", "Datasets, image processing and sample limits.");
  v.section(c.packing, "packing", "How samples are packed into rows.");
  v.section(c.train, "train", "Optimisation: batch, schedule, precision.");
  v.section(c.memory, "memory", "Device memory budget.");
  v.section(c.distributed, "distributed", "Multi-process training.");
  v.section(c.output, "output", "Run directory and checkpoints.");
  v.section(c.log, "log", "Logging.");
}

}  // namespace vlm
