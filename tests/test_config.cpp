// Tests of the config system: defaults, every kind of error with its message, overrides,
// derived values, the YAML round trip, refusals of what is not supported yet, configs/, and
// README's table of every key's default.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"

using namespace trident::config;

namespace {

// The smallest valid file: data.train is the one required key.
const std::string kMinimal = "data:\n  train: data/train.bin\n";
// The same with weights to adapt, which adapters need (training.lora.rank > 0).
const std::string kLoraBase = kMinimal + "model:\n  init_from: base.safetensors\n";

// The message of the ConfigError that parsing throws; fails the test if nothing is thrown.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    try {
        parse(yaml, "x.yaml", overrides);
    } catch (const ConfigError& e) {
        return e.what();
    }
    FAIL("expected a ConfigError for:\n" << yaml);
    return "";
}

bool starts_with(const std::string& s, const std::string& prefix) {
    return s.rfind(prefix, 0) == 0;
}

// A dataset key holding one path, as a plain string in YAML gives.
std::vector<DataSource> one(const std::string& path) {
    return {DataSource{path, 1.0}};
}

}  // namespace

TEST_CASE("config: every key has its documented default", "[config]") {
    const Config cfg = parse(kMinimal, "x.yaml");
    const Config defaults;
    CHECK(cfg.model == defaults.model);
    CHECK(cfg.parallel == defaults.parallel);
    CHECK(cfg.training == defaults.training);
    CHECK(cfg.checkpoint == defaults.checkpoint);
    CHECK(cfg.logging == defaults.logging);
    CHECK(cfg.device == DeviceKind::auto_);
    CHECK(cfg.data.train == one("data/train.bin"));
    CHECK(cfg.data.valid.empty());
    CHECK(cfg.data.format == DataFormat::auto_);
    CHECK(cfg.data.shuffle);
    CHECK(cfg.source == "x.yaml");

    // A few spelled out, so a changed default in config.h is a visible decision.
    CHECK(cfg.model.vocab_size == 50257);
    CHECK(cfg.parallel.schedule == trident::pipeline::Kind::one_f_one_b);
    CHECK(cfg.training.lr == 6.0e-4);
    CHECK(cfg.training.decay == Decay::cosine);
    CHECK(cfg.checkpoint.resume == "auto");
}

TEST_CASE("config: defaults that follow other keys, as Megatron-LM and GPT-2 derive them",
          "[config]") {
    // model.ffn_hidden: 4 x hidden, whatever hidden is, from the file or an override.
    CHECK(parse(kMinimal + "model: {hidden: 64, heads: 4}\n", "x.yaml").model.ffn_hidden == 256);
    CHECK(parse(kMinimal, "x.yaml", {"model.hidden=96"}).model.ffn_hidden == 384);
    // An explicit value still wins, in the file or from an override.
    CHECK(parse(kMinimal + "model: {hidden: 64, heads: 4, ffn_hidden: 100}\n", "x.yaml")
              .model.ffn_hidden == 100);
    CHECK(parse(kMinimal + "model: {hidden: 64, heads: 4}\n", "x.yaml", {"model.ffn_hidden=128"})
              .model.ffn_hidden == 128);
    // GPT-2 medium, written as its Hugging Face config.json gives it (no n_inner): 354.8 M.
    CHECK(parse(kMinimal + "model: {layers: 24, hidden: 1024, heads: 16}\n", "x.yaml")
              .derived.parameters == 354'823'168);

    // training.fp32_grad_accumulation: on under bf16 (8 bits of mantissa lose small
    // gradients when summed), off under fp16 and fp32 unless set.
    CHECK(parse(kMinimal + "training: {precision: bf16}\n", "x.yaml")
              .training.fp32_grad_accumulation);
    CHECK_FALSE(parse(kMinimal + "training: {precision: fp16}\n", "x.yaml")
                    .training.fp32_grad_accumulation);
    CHECK_FALSE(parse(kMinimal, "x.yaml").training.fp32_grad_accumulation);
    CHECK_FALSE(
        parse(kMinimal + "training: {precision: bf16, fp32_grad_accumulation: false}\n", "x.yaml")
            .training.fp32_grad_accumulation);
    CHECK(parse(kMinimal, "x.yaml", {"training.precision=bf16"}).training.fp32_grad_accumulation);
    // training.tf32: on unless turned off, whatever the precision (only fp32 products use it).
    CHECK(parse(kMinimal, "x.yaml").training.tf32);
    CHECK_FALSE(parse(kMinimal + "training: {tf32: false}\n", "x.yaml").training.tf32);
    CHECK_FALSE(parse(kMinimal, "x.yaml", {"training.tf32=false"}).training.tf32);
}

TEST_CASE("config: each run's metrics go beside its checkpoints unless set", "[config]") {
    CHECK_FALSE(parse(kMinimal, "x.yaml").logging.metrics);  // no checkpoint.dir: none
    CHECK(parse(kMinimal + "checkpoint: {dir: runs/a}\n", "x.yaml").logging.metrics ==
          "runs/a/metrics.jsonl");
    CHECK(parse(kMinimal + "checkpoint: {dir: runs/a}\n", "x.yaml", {"checkpoint.dir=runs/b"})
              .logging.metrics == "runs/b/metrics.jsonl");
    // Given, in the file or by an override, it stays: a path, or null for none.
    CHECK(parse(kMinimal + "checkpoint: {dir: runs/a}\nlogging: {metrics: m.jsonl}\n", "x.yaml")
              .logging.metrics == "m.jsonl");
    CHECK_FALSE(parse(kMinimal + "checkpoint: {dir: runs/a}\n", "x.yaml", {"logging.metrics=null"})
                    .logging.metrics);
}

TEST_CASE("config: the evaluation set is counted in sequences, whatever the layout", "[config]") {
    // One global batch unless given; a multiple of micro_batch x data.
    CHECK(parse(kMinimal + "training: {micro_batch: 2, global_batch: 12}\n", "x.yaml")
              .training.eval_sequences == 12);
    CHECK(parse(kMinimal, "x.yaml", {"training.eval_sequences=64"}).training.eval_sequences == 64);
    const std::string bad = error_of(kMinimal + "training: {micro_batch: 4, eval_sequences: 10}\n");
    CHECK(starts_with(bad, "x.yaml:"));
    CHECK(bad.find("training.eval_sequences (10) must be a multiple of micro_batch × "
                   "parallel.data = 4 × 1 = 4") != std::string::npos);
    CHECK(bad.find("a multiple of training.global_batch suits every layout") != std::string::npos);

    // The old key counted microbatches of the same samples 0, 1, ...: read as their sequences,
    // with a warning that names the line and what to write; never written back.
    const Config old =
        parse(kMinimal + "training:\n  micro_batch: 16\n  eval_batches: 4\n", "x.yaml");
    CHECK(old.training.eval_sequences == 64);
    CHECK(old.training.eval_batches == 0);
    REQUIRE(old.warnings.size() == 1);
    CHECK(old.warnings[0] ==
          "x.yaml:5: training.eval_batches is deprecated (it counted microbatches): read as "
          "training.eval_sequences = 4 x micro_batch 16 = 64; write that instead");
    CHECK(to_yaml(old).find("eval_batches") == std::string::npos);
    CHECK(parse(kMinimal, "x.yaml").warnings.empty());
    CHECK(error_of(kMinimal + "training: {eval_batches: 2, eval_sequences: 8}\n")
              .find("training.eval_batches: replaced by training.eval_sequences, which is given "
                    "too") != std::string::npos);
    // Two overrides: the later one stands.
    CHECK(parse(kMinimal, "x.yaml", {"training.eval_batches=2", "training.eval_sequences=8"})
              .training.eval_sequences == 8);
    // An override of the new key over a file's old one takes its place, with one note.
    const Config over = parse(kMinimal + "training:\n  micro_batch: 4\n  eval_batches: 4\n",
                              "x.yaml", {"training.eval_sequences=8"});
    CHECK(over.training.eval_sequences == 8);
    CHECK(over.warnings.empty());
    CHECK(over.notes == std::vector<std::string>{"--set training.eval_sequences=8 replaces the "
                                                 "deprecated training.eval_batches of x.yaml:5"});
    // And an override of the old key over the file's new one is read as the old key is.
    const Config back = parse(kMinimal + "training: {micro_batch: 4, eval_sequences: 8}\n",
                              "x.yaml", {"training.eval_batches=3"});
    CHECK(back.training.eval_sequences == 12);
    CHECK(back.warnings.size() == 1);
    CHECK(error_of(kMinimal, {"training.eval_batches=0"}) ==
          "--set training.eval_batches=0: training.eval_batches: must be >= 1, got 0");
}

TEST_CASE("config: hardware.peak_flops sets the peak MFU is against", "[config]") {
    CHECK(parse(kMinimal, "x.yaml").hardware.peak_flops == 0);  // measured
    CHECK(parse(kMinimal + "hardware: {peak_flops: 1.5e11}\n", "x.yaml").hardware.peak_flops ==
          1.5e11);
    CHECK(error_of(kMinimal, {"hardware.peak_flops=-1"}) ==
          "--set hardware.peak_flops=-1: hardware.peak_flops: must be >= 0, got -1");
}

TEST_CASE("config: values of every type are read", "[config]") {
    const Config cfg = parse(R"(
model: {vocab_size: 256, seq_len: 64, layers: 2, hidden: 64, heads: 4, ffn_hidden: 256,
        dropout: 0.1, init_std: 0.01, init_from: gpt2/model.safetensors}
parallel: {schedule: gpipe, zero_stage: 0}
training:
  micro_batch: 2
  global_batch: 8
  steps: 1e3          # integers may be written like this
  lr: 3e-4
  min_lr: 0
  decay: linear
  seed: 18446744073709551615
data: {train: "a b.bin", valid: ~, shuffle: False}
checkpoint: {dir: runs/x, interval: 100, keep: 1, resume: never}
logging: {interval: 10, metrics: null, trace: trace.json}
device: cpu
)",
                             "x.yaml");
    CHECK(cfg.model.vocab_size == 256);
    CHECK(cfg.model.dropout == 0.1);
    CHECK(cfg.model.init_from == "gpt2/model.safetensors");
    CHECK(cfg.parallel.schedule == trident::pipeline::Kind::gpipe);
    CHECK(cfg.parallel.zero_stage == 0);
    CHECK(cfg.training.steps == 1000);
    CHECK(cfg.training.lr == 3e-4);
    CHECK(cfg.training.min_lr == 0.0);
    CHECK(cfg.training.decay == Decay::linear);
    CHECK(cfg.training.seed == 18446744073709551615ull);
    CHECK(cfg.data.train == one("a b.bin"));
    CHECK(cfg.data.valid.empty());
    CHECK_FALSE(cfg.data.shuffle);
    CHECK(cfg.checkpoint.dir == "runs/x");
    CHECK(cfg.checkpoint.resume == "never");
    CHECK_FALSE(cfg.logging.metrics);
    CHECK(cfg.logging.trace == "trace.json");
    CHECK(cfg.device == DeviceKind::cpu);
}

TEST_CASE("config: empty sections and an omitted section are fine", "[config]") {
    const Config cfg = parse("training:\nmodel: {}\n" + kMinimal, "x.yaml");
    CHECK(cfg.training == TrainingConfig{});
}

TEST_CASE("config: malformed YAML names the file and line", "[config]") {
    const std::string msg = error_of("data:\n  train: a\ntraining:\n  lr: [1, 2\n  steps: 3\n");
    INFO(msg);
    CHECK(starts_with(msg, "x.yaml:"));
    CHECK(msg.find(": invalid YAML: ") != std::string::npos);
    CHECK(msg.find("end of sequence flow not found") != std::string::npos);
}

TEST_CASE("config: unknown keys and sections are refused with a suggestion", "[config]") {
    CHECK(error_of(kMinimal + "training:\n  lrr: 0.1\n") ==
          "x.yaml:4: training.lrr: unknown key (did you mean training.lr?)");
    CHECK(error_of(kMinimal + "training:\n  warmup_stpes: 5\n") ==
          "x.yaml:4: training.warmup_stpes: unknown key (did you mean training.warmup_steps?)");
    CHECK(error_of(kMinimal + "training:\n  warmup: 5\n") ==
          "x.yaml:4: training.warmup: unknown key (did you mean training.warmup_steps?)");
    // The same name in another section is the likely meaning.
    CHECK(error_of(kMinimal + "training:\n  dropout: 0.1\n") ==
          "x.yaml:4: training.dropout: unknown key (did you mean model.dropout?)");
    CHECK(error_of(kMinimal + "training:\n  flux_capacitor: 1\n") ==
          "x.yaml:4: training.flux_capacitor: unknown key");
    CHECK(error_of("traning:\n  lr: 0.1\n" + kMinimal) ==
          "x.yaml:1: traning: unknown section (did you mean training?)");
    CHECK(error_of(kMinimal + "scheduler:\n  kind: cosine\n") ==
          "x.yaml:3: scheduler: unknown section");
    CHECK(error_of(kMinimal + "lr: 0.1\n") ==
          "x.yaml:3: lr: unknown key (did you mean training.lr?)");
}

TEST_CASE("config: a huge unknown key or value is shown cut, without a suggestion", "[config]") {
    // A 1 MB name: no edit distance is computed over it, and the message shows its start.
    const std::string huge(1 << 20, 'k');
    // (YAML allows a key over 1024 characters only in the explicit form "? KEY".)
    std::string msg = error_of(kMinimal + "training:\n  ? " + huge + "\n  : 1\n");
    CHECK(msg == "x.yaml:4: training." + huge.substr(0, 55) + "... (1048585 bytes): unknown key");
    msg = error_of(kMinimal, {"training." + huge + "=1"});
    CHECK(msg.size() < 300);
    CHECK(msg.find("(1048585 bytes): unknown key") != std::string::npos);
    // A 1 MB value where a number belongs.
    msg = error_of(kMinimal + "training:\n  lr: " + huge + "\n");
    CHECK(msg == "x.yaml:4: training.lr: expected a number, got \"" + huge.substr(0, 64) +
                     "\"... (1048576 bytes)");
}

TEST_CASE("config: values of the wrong type are refused", "[config]") {
    CHECK(error_of(kMinimal + "training:\n  lr: fast\n") ==
          "x.yaml:4: training.lr: expected a number, got \"fast\"");
    CHECK(error_of(kMinimal + "model:\n  layers: 3.5\n") ==
          "x.yaml:4: model.layers: expected an integer, got 3.5");
    CHECK(error_of(kMinimal + "model:\n  layers: x\n") ==
          "x.yaml:4: model.layers: expected an integer, got \"x\"");
    CHECK(error_of(kMinimal + "model:\n  layers: 1e10\n") ==
          "x.yaml:4: model.layers: expected an integer that fits in 32 bits, got 1e10");
    CHECK(error_of(kMinimal + "model:\n  layers: [1, 2]\n") ==
          "x.yaml:4: model.layers: expected an integer, got a list");
    CHECK(error_of(kMinimal + "training:\n  seed: -1\n") ==
          "x.yaml:4: training.seed: expected a non-negative integer, got -1");
    CHECK(error_of(kMinimal + "training:\n  lr: .inf\n") ==
          "x.yaml:4: training.lr: expected a number, got \".inf\"");
    CHECK(error_of("data:\n  train: a\n  shuffle: maybe\n") ==
          "x.yaml:3: data.shuffle: expected true or false, got \"maybe\"");
    CHECK(error_of(kMinimal + "parallel:\n  schedule: 2f2b\n") ==
          "x.yaml:4: parallel.schedule: expected one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, "
          "zb-v; "
          "got \"2f2b\"");
    CHECK(error_of(kMinimal + "training:\n  precision: tf32\n") ==
          "x.yaml:4: training.precision: expected one of fp32, bf16, fp16; got \"tf32\"");
    CHECK(error_of(kMinimal + "training:\n  tf32: 1\n") ==
          "x.yaml:4: training.tf32: expected true or false, got 1");
    CHECK(error_of(kMinimal + "device: gpu\n") ==
          "x.yaml:3: device: expected one of auto, cpu, cuda; got \"gpu\"");
    CHECK(error_of(kMinimal + "training: 5\n") ==
          "x.yaml:3: training: expected a map of keys, got 5");
    CHECK(error_of(kMinimal + "logging: [a]\n") ==
          "x.yaml:3: logging: expected a map of keys, got a list");
    CHECK(error_of("data:\n  train: null\n") ==
          "x.yaml:2: data.train: expected a path or a list of {path, weight}, got null");
    CHECK(error_of("- 1\n- 2\n").find("x.yaml:1: expected a map of model, parallel") == 0);
}

TEST_CASE("config: a key given twice is refused", "[config]") {
    CHECK(error_of(kMinimal + "training:\n  lr: 0.1\n  lr: 0.2\n") ==
          "x.yaml:5: training.lr: given twice (first at line 4)");
    CHECK(error_of(kMinimal + "training:\n  lr: 0.1\ntraining:\n  steps: 2\n") ==
          "x.yaml:5: training: given twice (first at line 3)");
}

TEST_CASE("config: data.train is required to train", "[config]") {
    CHECK(error_of("") == "x.yaml: data.train: required key missing");
    CHECK(error_of("model:\n  layers: 2\n") == "x.yaml: data.train: required key missing");
    CHECK(error_of("data:\n  train: ''\n") == "x.yaml:2: data.train: must not be empty");
    // An override can supply it.
    CHECK(parse("", "x.yaml", {"data.train=t.bin"}).data.train == one("t.bin"));
    // bench trains on random tokens and plan runs nothing: neither reads data.
    CHECK(parse("", "x.yaml", {}, Purpose::bench).data.train.empty());
    CHECK(parse("", "x.yaml", {}, Purpose::plan).data.train.empty());
}

TEST_CASE("config: out-of-range values name their line and key", "[config]") {
    struct Case {
        std::string yaml;
        std::string message;
    };
    const std::vector<Case> cases = {
        {"model:\n  layers: 0\n", "x.yaml:4: model.layers: must be in [1, 4096], got 0"},
        {"model:\n  vocab_size: 1\n",
         "x.yaml:4: model.vocab_size: must be in [2, 16777216], got 1"},
        {"model:\n  seq_len: 0\n", "x.yaml:4: model.seq_len: must be in [1, 1048576], got 0"},
        {"model:\n  dropout: 1.0\n", "x.yaml:4: model.dropout: must be in [0, 1), got 1"},
        {"model:\n  dropout: -0.1\n", "x.yaml:4: model.dropout: must be in [0, 1), got -0.1"},
        {"training:\n  lr: 0\n", "x.yaml:4: training.lr: must be > 0, got 0"},
        {"training:\n  min_lr: -1e-5\n", "x.yaml:4: training.min_lr: must be >= 0, got -1e-05"},
        {"training:\n  beta2: 1\n", "x.yaml:4: training.beta2: must be in [0, 1), got 1"},
        {"training:\n  eps: 0\n", "x.yaml:4: training.eps: must be > 0, got 0"},
        {"training:\n  weight_decay: -0.1\n",
         "x.yaml:4: training.weight_decay: must be >= 0, got -0.1"},
        {"training:\n  grad_clip: -1\n", "x.yaml:4: training.grad_clip: must be >= 0, got -1"},
        {"training:\n  micro_batch: 0\n",
         "x.yaml:4: training.micro_batch: must be in [1, 16777216], got 0"},
        {"training:\n  steps: 0\n", "x.yaml:4: training.steps: must be >= 1, got 0"},
        {"training:\n  warmup_steps: -1\n",
         "x.yaml:4: training.warmup_steps: must be >= 0, got -1"},
        {"training:\n  threads: -2\n", "x.yaml:4: training.threads: must be >= 0, got -2"},
        {"parallel:\n  zero_stage: 4\n",
         "x.yaml:4: parallel.zero_stage: must be 0, 1, 2 or 3, got 4"},
        {"parallel:\n  tensor: 0\n", "x.yaml:4: parallel.tensor: must be in [1, 65536], got 0"},
        {"checkpoint:\n  keep: 0\n", "x.yaml:4: checkpoint.keep: must be >= 1, got 0"},
        {"checkpoint:\n  interval: -5\n", "x.yaml:4: checkpoint.interval: must be >= 0, got -5"},
        {"logging:\n  interval: 0\n", "x.yaml:4: logging.interval: must be >= 1, got 0"},
        // Sizes are bounded, so that no product of them overflows (config.h's limits).
        {"model:\n  layers: 1e9\n", "x.yaml:4: model.layers: must be in [1, 4096], got 1000000000"},
        {"model:\n  hidden: 1000000\n",
         "x.yaml:4: model.hidden: must be in [1, 131072], got 1000000"},
        {"model:\n  vocab_size: 2147483647\n",
         "x.yaml:4: model.vocab_size: must be in [2, 16777216], got 2147483647"},
        {"model:\n  seq_len: 2147483647\n",
         "x.yaml:4: model.seq_len: must be in [1, 1048576], got 2147483647"},
        {"parallel:\n  virtual_stages: 2147483647\n",
         "x.yaml:4: parallel.virtual_stages: must be in [1, 4096], got 2147483647"},
        {"training:\n  global_batch: 2147483647\n",
         "x.yaml:4: training.global_batch: must be in [1, 16777216], got 2147483647"},
    };
    for (const Case& c : cases) {
        INFO(c.yaml);
        CHECK(error_of(kMinimal + c.yaml) == c.message);
    }
}

TEST_CASE("config: inconsistent values name the line of the key at fault", "[config]") {
    CHECK(error_of(kMinimal + "training:\n  micro_batch: 4\n  global_batch: 30\n") ==
          "x.yaml:5: training.global_batch (30) must be a multiple of micro_batch × parallel.data "
          "= 4 × 1 = 4");
    // With global_batch left at its default (32), the line that broke it is micro_batch's.
    CHECK(error_of(kMinimal + "training:\n  micro_batch: 5\n") ==
          "x.yaml:4: training.global_batch (32) must be a multiple of micro_batch × parallel.data "
          "= 5 × 1 = 5");
    CHECK(error_of(kMinimal + "model:\n  hidden: 770\n") ==
          "x.yaml:4: model.hidden (770) must be a multiple of model.heads (12) unless "
          "model.head_dim gives the heads' width");
    CHECK(error_of(kMinimal + "training:\n  lr: 1e-4\n  min_lr: 1e-3\n") ==
          "x.yaml:5: training.min_lr (0.001) must not exceed training.lr (1e-04)");
}

TEST_CASE("config: overrides are applied after the file with the same checks", "[config]") {
    SECTION("valid values of each kind") {
        const Config cfg =
            parse(kMinimal + "training:\n  lr: 1e-3\n", "x.yaml",
                  {"training.lr=3e-4", "data.shuffle=false", "data.valid=null",
                   "parallel.schedule=gpipe", "model.init_from=hf/gpt2.safetensors",
                   "checkpoint.dir=runs/a b", "data.train=data/[ab].bin", "device=cpu"});
        CHECK(cfg.training.lr == 3e-4);
        CHECK_FALSE(cfg.data.shuffle);
        CHECK(cfg.data.valid.empty());
        CHECK(cfg.parallel.schedule == trident::pipeline::Kind::gpipe);
        CHECK(cfg.model.init_from == "hf/gpt2.safetensors");
        CHECK(cfg.checkpoint.dir == "runs/a b");
        CHECK(cfg.data.train == one("data/[ab].bin"));  // not valid YAML: taken as the plain string
        CHECK(cfg.device == DeviceKind::cpu);
    }
    SECTION("a section absent from the file is created") {
        const Config cfg =
            parse(kMinimal, "x.yaml", {"logging.metrics=runs/m.jsonl", "parallel.schedule=1f1b"});
        CHECK(cfg.logging.metrics == "runs/m.jsonl");
        CHECK(cfg.parallel.schedule == trident::pipeline::Kind::one_f_one_b);
    }
    SECTION("later overrides win") {
        CHECK(parse(kMinimal, "x.yaml", {"training.steps=5", "training.steps=7"}).training.steps ==
              7);
    }
    SECTION("errors name the override") {
        CHECK(error_of(kMinimal, {"training.lr=fast"}) ==
              "--set training.lr=fast: training.lr: expected a number, got \"fast\"");
        CHECK(error_of(kMinimal, {"training.lrr=0.1"}) ==
              "--set training.lrr=0.1: training.lrr: unknown key (did you mean training.lr?)");
        CHECK(error_of(kMinimal, {"training.steps=0"}) ==
              "--set training.steps=0: training.steps: must be >= 1, got 0");
        CHECK(error_of(kMinimal, {"training.lr"}) ==
              "--set training.lr: expected key.path=value, e.g. training.lr=3e-4");
        CHECK(error_of(kMinimal, {"training=1"}) ==
              "--set training=1: training: is a section; set one of its keys, e.g. "
              "training.micro_batch");
        CHECK(error_of(kMinimal, {"model.layers=[1"}) ==
              "--set model.layers=[1: model.layers: expected an integer, got \"[1\"");
    }
    SECTION("an override that breaks consistency is blamed over the file") {
        const std::string file = kMinimal + "training:\n  micro_batch: 4\n  global_batch: 32\n";
        CHECK(error_of(file, {"training.global_batch=30"}) ==
              "--set training.global_batch=30: training.global_batch (30) must be a multiple of "
              "micro_batch × parallel.data = 4 × 1 = 4");
        CHECK(error_of(file, {"training.micro_batch=5"}) ==
              "--set training.micro_batch=5: training.global_batch (32) must be a multiple of "
              "micro_batch × parallel.data = 5 × 1 = 5");
        // An override can also repair the file.
        CHECK(
            parse(kMinimal + "training:\n  lr: 0\n", "x.yaml", {"training.lr=1e-3"}).training.lr ==
            1e-3);
    }
}

TEST_CASE("config: parallel layouts and what is not supported yet", "[config]") {
    CHECK(
        parse(kMinimal, "x.yaml", {"parallel.data=4", "training.global_batch=32"}).parallel.data ==
        4);
    CHECK(error_of(kMinimal, {"parallel.data=3"}) ==
          "--set parallel.data=3: training.global_batch (32) must be a multiple of micro_batch × "
          "parallel.data = 4 × 3 = 12");
    CHECK(parse(kMinimal + "parallel:\n  pipeline: 2\n  tensor: 2\n", "x.yaml").parallel.pipeline ==
          2);
    CHECK(error_of(kMinimal + "parallel:\n  pipeline: 5\n  stage_layers: uniform\n") ==
          "x.yaml:4: model.layers (12) must be a multiple of parallel.pipeline × virtual_stages = "
          "5 × 1 = 5"
          " for parallel.stage_layers: uniform (auto or a list of counts cuts unequally)");
    CHECK(parse(kMinimal + "parallel:\n  sequence_parallel: true\n  tensor: 2\n", "x.yaml")
              .parallel.sequence_parallel);
    CHECK(error_of(kMinimal + "parallel:\n  tensor: 5\n") ==
          "x.yaml:4: parallel.tensor (5) must divide model.heads (12)");
    CHECK(parse(kMinimal + "training:\n  precision: bf16\n  nonfinite: skip\n", "x.yaml")
              .training.nonfinite == NonFinite::skip);
    CHECK(error_of(kMinimal +
                   "training:\n  precision: fp16\n  loss_scale: 8\n  min_loss_scale: 16\n") ==
          "x.yaml:6: training.min_loss_scale (16) must not exceed training.loss_scale (8)");
    CHECK(error_of(kMinimal, {"training.nonfinite=ignore"}).find("training.nonfinite") !=
          std::string::npos);
    CHECK(parse(kMinimal + "training:\n  recompute: full\n", "x.yaml").training.recompute ==
          Recompute::full);
    CHECK(error_of(kMinimal + "parallel:\n  schedule: interleaved\n") ==
          "x.yaml:4: parallel.schedule: interleaved needs parallel.pipeline >= 2 (got 1)");
    // ZeRO-3 runs on a pipeline with every schedule; keeping its gathered units is its alone.
    CHECK(
        parse(kMinimal + "parallel:\n  zero_stage: 3\n  pipeline: 2\n  schedule: zb-h2\n", "x.yaml")
            .parallel.schedule == trident::pipeline::Kind::zb_h2);
    CHECK(error_of(kMinimal, {"parallel.reshard_after_forward=false"}) ==
          "--set parallel.reshard_after_forward=false: parallel.reshard_after_forward: false needs "
          "parallel.zero_stage 3 (got 1): below stage 3 the parameters are whole on every "
          "replica");
    CHECK(error_of(kMinimal + "parallel:\n  schedule: interleaved\n  pipeline: 2\n") ==
          "x.yaml:4: parallel.schedule: interleaved needs parallel.virtual_stages >= 2 (got 1)");
#if TRIDENT_HAVE_CUDA
    CHECK(parse(kMinimal + "device: cuda\n", "x.yaml").device == DeviceKind::cuda);
#else
    CHECK(error_of(kMinimal + "device: cuda\n") ==
          "x.yaml:3: device: this build has no CUDA backend (built without the CUDA toolkit; use "
          "auto or cpu)");
#endif
}

TEST_CASE("config: derived values", "[config]") {
    SECTION("GPT-2 small") {
        const Config cfg =
            parse(kMinimal + "training: {micro_batch: 4, global_batch: 8}\n", "x.yaml");
        const Derived& d = cfg.derived;
        CHECK(d.padded_vocab == 50304);
        CHECK(d.head_dim == 64);
        CHECK(d.world_size == 1);
        CHECK(d.grad_accum_steps == 2);
        CHECK(d.tokens_per_step == 8 * 1024);
        CHECK(d.parameters == 124'439'808);  // GPT-2 124M
        // 72·B·s·l·h²·(1 + s/(12h) + V/(12·l·h)) with B=8, s=1024, l=12, h=768, V=50257.
        CHECK(d.flops_per_step == Approx(6535702904832.0).epsilon(1e-12));
    }
    SECTION("vocabulary padding") {
        Config cfg;
        cfg.model.vocab_size = 100;
        derive(cfg);
        CHECK(cfg.derived.padded_vocab == 128);
        cfg.model.vocab_size = 128;
        derive(cfg);
        CHECK(cfg.derived.padded_vocab == 128);
        // Split over M = 2, each shard stays a multiple of 128.
        cfg.model.vocab_size = 50257;
        cfg.parallel.tensor = 2;
        derive(cfg);
        CHECK(cfg.derived.padded_vocab == 50432);
    }
}

TEST_CASE("config: to_yaml writes every key and reads back to the same config", "[config]") {
    const Config original = parse(
        kMinimal, "x.yaml",
        {"model.vocab_size=256", "model.dropout=0.1", "model.init_std=0.015",
         "model.init_from='w:\"gpt2\" #1.bin'", "parallel.schedule=gpipe", "parallel.zero_stage=0",
         "training.lr=3e-4", "training.min_lr=1e-05", "training.seed=18446744073709551615",
         "training.eps=1e-8", "training.decay=linear", "training.tf32=false",
         "training.lora={rank: 4, targets: [qkv], init_from: a.safetensors}", "data.valid='null'",
         "data.shuffle=false", "checkpoint.dir=runs/#1", "checkpoint.resume=never",
         "logging.trace=t.json", "device=cpu"});
    CHECK(original.model.init_from == "w:\"gpt2\" #1.bin");
    CHECK(original.data.valid == one("null"));  // quoted: the string, not null

    const std::string yaml = to_yaml(original);
    INFO(yaml);
    for (const char* key : {"vocab_size:", "init_from:", "sequence_parallel:", "eval_sequences:",
                            "tf32: false", "lora:", "shuffle:", "keep:", "trace:", "device:"})
        CHECK(yaml.find(key) != std::string::npos);

    Config again = parse(yaml, "saved.yaml");
    CHECK(again.source == "saved.yaml");
    again.source = original.source;
    CHECK(again == original);
    CHECK(to_yaml(again) == yaml);
}

TEST_CASE("config: to_string spells enums as YAML does", "[config]") {
    CHECK(std::string(to_string(trident::pipeline::Kind::one_f_one_b)) == "1f1b");
    CHECK(std::string(to_string(Decay::constant)) == "constant");
    CHECK(std::string(trident::kernels::name_of(trident::kernels::DType::bf16)) == "bf16");
    CHECK(std::string(to_string(Recompute::selective)) == "selective");
    CHECK(std::string(to_string(DeviceKind::auto_)) == "auto");
    CHECK(std::string(to_string(DataFormat::megatron)) == "megatron");
}

TEST_CASE("config: load reads a file and reports one it cannot open", "[config]") {
    CHECK_THROWS_WITH(
        load("no/such/x.yaml"),
        "config file no/such/x.yaml: cannot open: No such file or directory (ENOENT)");
    // A device or a FIFO is refused at once: reading /dev/zero would never end, and opening a
    // FIFO would wait for a writer.
    CHECK_THROWS_WITH(load("/dev/zero"),
                      "config file /dev/zero: not a regular file (a character device)");
    const std::string fifo = (std::filesystem::temp_directory_path() /
                              ("trident_config_fifo_" + std::to_string(::getpid())))
                                 .string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK_THROWS_WITH(load(fifo), "config file " + fifo + ": not a regular file (a FIFO)");
    std::filesystem::remove(fifo);
    const Config cfg = load(TRIDENT_SOURCE_DIR "/configs/default.yaml", {"training.steps=3"});
    CHECK(cfg.source == TRIDENT_SOURCE_DIR "/configs/default.yaml");
    CHECK(cfg.training.steps == 3);
    CHECK(cfg.model.vocab_size == 50257);
}

TEST_CASE("config: the llama keys, their defaults and their limits", "[config]") {
    const Config gpt2 = parse(kMinimal, "x.yaml");
    CHECK(gpt2.model.arch == Arch::gpt2);
    CHECK(gpt2.model.kv_heads == 12);
    CHECK(gpt2.model.tie_embeddings);
    CHECK(gpt2.model.ffn_hidden == 3072);
    // Llama's SwiGLU width: 8h/3 rounded up to a multiple of 256 (Llama-2 7B's 11008).
    const Config llama = parse(kMinimal + "model:\n  arch: llama\n  hidden: 4096\n  heads: 32\n",
                               "x.yaml", {"model.kv_heads=8"});
    CHECK(llama.model.ffn_hidden == 11008);
    CHECK(llama.model.kv_heads == 8);
    CHECK(!llama.model.tie_embeddings);
    CHECK(llama.model.rope_theta == 10000.0);
    CHECK(llama.model.norm_eps == 1e-5);
    CHECK(parse(kMinimal + "model:\n  arch: llama\n  hidden: 768\n", "x.yaml").model.ffn_hidden ==
          2048);
    CHECK(
        parse(kMinimal, "x.yaml", {"model.arch=llama", "model.ffn_hidden=100"}).model.ffn_hidden ==
        100);
    CHECK(parse(kMinimal, "x.yaml", {"model.arch=llama", "model.tie_embeddings=true"})
              .model.tie_embeddings);

    CHECK(error_of(kMinimal, {"model.arch=falcon"})
              .starts_with("--set model.arch=falcon: model.arch: expected one of gpt2, llama"));
    CHECK(error_of(kMinimal, {"model.arch=llama", "model.kv_heads=5"}) ==
          "--set model.kv_heads=5: model.kv_heads (5) must divide model.heads (12): each "
          "key/value head serves heads / kv_heads query heads");
    CHECK(error_of(kMinimal, {"model.kv_heads=4"}) ==
          "--set model.kv_heads=4: model.kv_heads (4) differs from model.heads (12): grouped-query "
          "attention needs model.arch: llama");
    CHECK(error_of(kMinimal, {"model.rope_theta=500000"}) ==
          "--set model.rope_theta=500000: model.rope_theta (5e+05) sets llama's rotary "
          "positions; GPT-2 learns its position embedding (model.arch: gpt2)");
    CHECK(error_of(kMinimal, {"model.norm_eps=1e-6"}) ==
          "--set model.norm_eps=1e-6: model.norm_eps (1e-06) sets llama's RMSNorm; GPT-2's "
          "LayerNorm has eps 1e-5 (model.arch: gpt2)");
    CHECK(error_of(kMinimal, {"model.qk_norm=true"}) ==
          "--set model.qk_norm=true: model.qk_norm: true needs model.arch: llama (it normalizes "
          "each query and key head of grouped-query attention; the layer's is gpt2)");
    CHECK(error_of(kMinimal, {"model.tie_embeddings=false"}) ==
          "--set model.tie_embeddings=false: model.tie_embeddings: false needs model.arch: llama "
          "(GPT-2's LM head is its token embedding)");
    CHECK(error_of(kMinimal, {"model.arch=llama", "model.hidden=36", "model.heads=4"}) ==
          "--set model.heads=4: model.arch: llama rotates pairs of channels: the head size "
          "(model.head_dim, else model.hidden / model.heads) = 9 must be even");
    CHECK(error_of(kMinimal, {"model.arch=llama", "model.head_dim=9"}) ==
          "--set model.head_dim=9: model.arch: llama rotates pairs of channels: the head size "
          "(model.head_dim, else model.hidden / model.heads) = 9 must be even");
    CHECK(error_of(kMinimal, {"model.head_dim=32"}) ==
          "--set model.head_dim=32: model.head_dim (32) sets the heads' width of llama's "
          "grouped-query attention; GPT-2's heads are model.hidden / model.heads wide (the "
          "layer's attention is gpt2)");
    // A llama's heads may be wider or narrower than hidden / heads (Qwen3's).
    CHECK_NOTHROW(
        parse(kMinimal, "x.yaml",
              {"model.arch=llama", "model.hidden=36", "model.heads=4", "model.head_dim=16"}));
    // Fewer key/value heads than tensor ranks (or than M·C under Ulysses): replicated.
    CHECK_NOTHROW(
        parse(kMinimal, "x.yaml", {"model.arch=llama", "model.kv_heads=2", "parallel.tensor=4"}));
    CHECK_NOTHROW(parse(kMinimal, "x.yaml",
                        {"model.arch=llama", "model.kv_heads=2", "parallel.context=4",
                         "parallel.context_mode=ulysses"}));
    CHECK(error_of(kMinimal, {"model.arch=llama", "model.kv_heads=3", "parallel.tensor=2"}) ==
          "--set parallel.tensor=2: parallel.tensor (2) must divide model.kv_heads (3) or be a "
          "multiple of it: each tensor rank holds whole key/value heads");
    CHECK(error_of(kLoraBase, {"model.arch=llama", "model.kv_heads=2", "parallel.tensor=4",
                               "training.lora.rank=4"}) ==
          "--set training.lora.rank=4: training.lora.rank > 0 with parallel.tensor (4) above "
          "model.kv_heads (2): adapters of key/value heads replicated over tensor ranks are not "
          "built");
    // Each layer kind adapts its own linears; a llama's default targets are q and v.
    CHECK(parse(kLoraBase, "x.yaml", {"model.arch=llama", "training.lora.rank=4"})
              .training.lora.targets == std::vector<LoraTarget>{LoraTarget::q, LoraTarget::v});
    CHECK(parse(kLoraBase, "x.yaml", {"training.lora.rank=4"}).training.lora.targets ==
          std::vector<LoraTarget>{LoraTarget::qkv, LoraTarget::attn_proj, LoraTarget::fc,
                                  LoraTarget::fc_proj});
    CHECK(parse(kLoraBase, "x.yaml",
                {"model.arch=llama", "training.lora.rank=4", "training.lora.targets=[down, k]"})
              .training.lora.targets == std::vector<LoraTarget>{LoraTarget::down, LoraTarget::k});
    CHECK(error_of(kLoraBase,
                   {"model.arch=llama", "training.lora.rank=4", "training.lora.targets=[q, fc]"}) ==
          "--set training.lora.targets=[q, fc]: training.lora.targets: fc is not a linear of "
          "the layer (grouped attention, swiglu MLP): its targets are q, k, v, o, gate, up, "
          "down");
    CHECK(error_of(kLoraBase, {"training.lora.rank=4", "training.lora.targets=[qkv, up]"}) ==
          "--set training.lora.targets=[qkv, up]: training.lora.targets: up is not a linear of "
          "the layer (gpt2 attention, gelu MLP): its targets are qkv, attn_proj, fc, fc_proj");
    CHECK(error_of(kMinimal, {"model.rope_theta=0"}) ==
          "--set model.rope_theta=0: model.rope_theta: must be > 0, got 0");
    CHECK(error_of(kMinimal, {"model.norm_eps=-1"}) ==
          "--set model.norm_eps=-1: model.norm_eps: must be > 0, got -1");
}

TEST_CASE("config: README's table gives every key's default", "[config]") {
    std::ifstream in(TRIDENT_SOURCE_DIR "/README.md");
    const std::string readme{std::istreambuf_iterator<char>(in), {}};
    REQUIRE(!readme.empty());
    // The keys as to_yaml writes them: "section:" lines, then "  key: value" under them.
    std::istringstream yaml(to_yaml(parse(kMinimal, "x.yaml")));
    std::string section;
    int keys = 0;
    for (std::string line; std::getline(yaml, line);) {
        if (line.empty() || line[0] == '#') continue;
        const std::string name = line.substr(0, line.find(':'));
        if (line.back() == ':') {
            section = name;
            continue;
        }
        const bool nested = line.starts_with("  ");
        const std::string path = nested ? section + "." + name.substr(2) : name;
        INFO(path);
        CHECK(readme.find("\n| `" + path + "` | ") != std::string::npos);
        ++keys;
    }
    CHECK(keys >= 50);
}

TEST_CASE("config: every file in configs/ loads", "[config]") {
    int files = 0;
    // Checked as a plan checks them: some describe GPU runs this build cannot start. Each
    // uses current keys only (no warning, no note) and keeps its run under runs/.
    for (const auto& entry : std::filesystem::directory_iterator(TRIDENT_SOURCE_DIR "/configs")) {
        if (entry.path().extension() != ".yaml") continue;
        INFO(entry.path().string());
        Config cfg;
        REQUIRE_NOTHROW(cfg = load(entry.path().string(), {}, Purpose::plan));
        CHECK(cfg.warnings.empty());
        CHECK(cfg.notes.empty());
        REQUIRE(cfg.checkpoint.dir);
        CHECK(starts_with(*cfg.checkpoint.dir, "runs/"));
        ++files;
    }
    CHECK(files >= 3);

    const Config gpt2 = load(TRIDENT_SOURCE_DIR "/configs/gpt2-124m.yaml");
    CHECK(gpt2.derived.parameters == 124'439'808);
}

TEST_CASE("config: data.train and data.valid take a weighted blend", "[config]") {
    const Config cfg = parse(R"(
data:
  train:
    - {path: a, weight: 0.7}
    - path: corpus/b.bin
      weight: 3
  valid: [{path: v, weight: 1}]
  format: megatron
)",
                             "x.yaml");
    CHECK(cfg.data.train == std::vector<DataSource>{{"a", 0.7}, {"corpus/b.bin", 3.0}});
    CHECK(cfg.data.valid == one("v"));
    CHECK(cfg.data.format == DataFormat::megatron);

    const Config set = parse(kMinimal, "x.yaml",
                             {"data.train=[{path: a, weight: 1}, {path: b, weight: 2}]",
                              "data.valid=[{path: v, weight: 0.5}]", "data.format=llmc"});
    CHECK(set.data.train == std::vector<DataSource>{{"a", 1.0}, {"b", 2.0}});
    CHECK(set.data.valid == std::vector<DataSource>{{"v", 0.5}});
    CHECK(set.data.format == DataFormat::llmc);

    // Written back as a flow list (one dataset of weight 1 as its plain path), read back equal.
    const std::string yaml = to_yaml(set);
    INFO(yaml);
    CHECK(yaml.find("  train: [{path: \"a\", weight: 1.0}, {path: \"b\", weight: 2.0}]\n") !=
          std::string::npos);
    CHECK(yaml.find("  valid: [{path: \"v\", weight: 0.5}]\n") != std::string::npos);
    CHECK(yaml.find("  format: llmc\n") != std::string::npos);
    Config again = parse(yaml, "x.yaml");
    CHECK(again == set);
    CHECK(to_yaml(parse(kMinimal, "x.yaml")).find("  train: \"data/train.bin\"\n  valid: null\n") !=
          std::string::npos);
}

TEST_CASE("config: bad blend items are named by their line", "[config]") {
    const std::string head = "data:\n  train:\n    - {path: a, weight: 1}\n";
    CHECK(error_of(head + "    - {weight: 2}\n") == "x.yaml:4: data.train: item 2: missing path");
    CHECK(error_of(head + "    - {path: b}\n") == "x.yaml:4: data.train: item 2: missing weight");
    CHECK(error_of(head + "    - {path: b, weight: 0}\n") ==
          "x.yaml:4: data.train: item 2: weight: must be > 0, got 0");
    CHECK(error_of(head + "    - {path: b, weight: -0.5}\n") ==
          "x.yaml:4: data.train: item 2: weight: must be > 0, got -0.5");
    CHECK(error_of(head + "    - {path: b, weight: heavy}\n") ==
          "x.yaml:4: data.train: item 2: weight: expected a number, got \"heavy\"");
    CHECK(error_of(head + "    - {path: '', weight: 1}\n") ==
          "x.yaml:4: data.train: item 2: path: must not be empty");
    CHECK(error_of(head + "    - {path: [b], weight: 1}\n") ==
          "x.yaml:4: data.train: item 2: path: expected a string, got a list");
    // In a block-style item, the line of the key at fault.
    CHECK(error_of(head + "    - path: b\n      wieght: 2\n") ==
          "x.yaml:5: data.train: item 2: unknown key \"wieght\" (an item has path and weight)");
    CHECK(error_of(head + "    - path: b\n      weight: 1\n      weight: 2\n") ==
          "x.yaml:6: data.train: item 2: weight given twice");
    CHECK(error_of(head + "    - b.bin\n") ==
          "x.yaml:4: data.train: item 2: expected {path: ..., weight: ...}, got \"b.bin\" (each "
          "dataset of a blend has a weight; for one stream of several llm.c files, write a glob)");
    CHECK(error_of("data:\n  train: []\n") ==
          "x.yaml:2: data.train: expected a path or a list of {path, weight}, got an empty list");
    CHECK(error_of("data:\n  train: {path: a, weight: 1}\n") ==
          "x.yaml:2: data.train: expected a path or a list of {path, weight}, got a map");
    CHECK(error_of(kMinimal + "  valid:\n    - {path: v, weight: 1}\n    - {path: w}\n") ==
          "x.yaml:5: data.valid: item 2: missing weight");
    CHECK(error_of(kMinimal + "  format: hdf5\n") ==
          "x.yaml:3: data.format: expected one of auto, llmc, megatron; got \"hdf5\"");
    // An override's items are named by the override.
    CHECK(
        error_of(kMinimal, {"data.train=[{path: a, weight: 0}]"}) ==
        "--set data.train=[{path: a, weight: 0}]: data.train: item 1: weight: must be > 0, got 0");
}

TEST_CASE("config: training.lora reads each part and keeps the defaults of the rest", "[config]") {
    const LoraConfig defaults;
    CHECK(parse(kLoraBase, "x.yaml").training.lora == defaults);
    CHECK(defaults.rank == 0);
    CHECK_FALSE(defaults.enabled());
    CHECK(defaults.alpha == 16.0);
    CHECK(defaults.dropout == 0.0);
    CHECK(defaults.targets == std::vector<LoraTarget>{LoraTarget::qkv, LoraTarget::attn_proj,
                                                      LoraTarget::fc, LoraTarget::fc_proj});
    CHECK_FALSE(defaults.init_from);

    const LoraConfig all = parse(kLoraBase + R"(training:
  lora:
    rank: 8
    alpha: 32
    dropout: 0.05
    targets: [fc_proj, qkv]
    init_from: adapters/a.safetensors
)",
                                 "x.yaml")
                               .training.lora;
    CHECK(all.rank == 8);
    CHECK(all.enabled());
    CHECK(all.alpha == 32.0);
    CHECK(all.dropout == 0.05);
    CHECK(all.targets == std::vector<LoraTarget>{LoraTarget::fc_proj, LoraTarget::qkv});
    CHECK(all.init_from == "adapters/a.safetensors");

    // Parts left out keep their defaults; a block list of targets reads as a flow one.
    LoraConfig expected;
    expected.rank = 4;
    expected.targets = {LoraTarget::attn_proj, LoraTarget::fc};
    CHECK(parse(kLoraBase + "training:\n  lora:\n    rank: 4\n    targets:\n      - attn_proj\n"
                            "      - fc\n",
                "x.yaml")
              .training.lora == expected);
    expected.targets = defaults.targets;
    expected.init_from = "b.safetensors";
    CHECK(parse(kLoraBase + "training: {lora: {init_from: b.safetensors, rank: 4}}\n", "x.yaml")
              .training.lora == expected);

    // null, nothing and an empty map all mean every default.
    for (const char* value : {"null", "", "{}", "{init_from: null}"}) {
        INFO(value);
        CHECK(parse(kLoraBase + "training:\n  lora: " + value + "\n", "x.yaml").training.lora ==
              defaults);
    }
}

TEST_CASE("config: bad training.lora parts are named by their path and line", "[config]") {
    const std::string head = kMinimal + "training:\n  lora:\n";
    CHECK(error_of(head + "    rank: -1\n") ==
          "x.yaml:5: training.lora.rank: must be >= 0, got -1");
    CHECK(error_of(head + "    rank: 2.5\n") ==
          "x.yaml:5: training.lora.rank: expected an integer, got 2.5");
    CHECK(error_of(head + "    rank: 8\n    alpha: 0\n") ==
          "x.yaml:6: training.lora.alpha: must be > 0, got 0");
    CHECK(error_of(head + "    alpha: big\n") ==
          "x.yaml:5: training.lora.alpha: expected a number, got \"big\"");
    CHECK(error_of(head + "    dropout: 1\n") ==
          "x.yaml:5: training.lora.dropout: must be in [0, 1), got 1");
    CHECK(error_of(head + "    dropout: -0.1\n") ==
          "x.yaml:5: training.lora.dropout: must be in [0, 1), got -0.1");
    CHECK(error_of(head + "    rnak: 8\n") ==
          "x.yaml:5: training.lora.rnak: unknown key (did you mean training.lora.rank?)");
    CHECK(error_of(head + "    rank: 8\n    target: [qkv]\n") ==
          "x.yaml:6: training.lora.target: unknown key (did you mean training.lora.targets?)");
    CHECK(error_of(head + "    scale: 2\n") == "x.yaml:5: training.lora.scale: unknown key");
    CHECK(error_of(head + "    rank: 8\n    rank: 4\n") ==
          "x.yaml:6: training.lora.rank: given twice (first at line 5)");
    CHECK(error_of(head + "    init_from: [a]\n") ==
          "x.yaml:5: training.lora.init_from: expected a string or null, got a list");

    const std::string names = "qkv, attn_proj, fc, fc_proj, q, k, v, o, gate, up, down";
    const std::string list = "expected a non-empty list of " + names + ", got ";
    CHECK(error_of(head + "    targets: []\n") ==
          "x.yaml:5: training.lora.targets: " + list + "an empty list");
    CHECK(error_of(head + "    targets: qkv\n") ==
          "x.yaml:5: training.lora.targets: " + list + "\"qkv\"");
    CHECK(error_of(head + "    targets: [qkv, mlp]\n") ==
          "x.yaml:5: training.lora.targets: item 2: expected one of " + names + "; got \"mlp\"");
    CHECK(error_of(head + "    targets: [fc, qkv, fc]\n") ==
          "x.yaml:5: training.lora.targets: fc given twice");
    // In a block list, the line of the item at fault.
    CHECK(error_of(head + "    targets:\n      - qkv\n      - proj\n") ==
          "x.yaml:7: training.lora.targets: item 2: expected one of " + names + "; got \"proj\"");

    CHECK(error_of(kMinimal + "training:\n  lora: 8\n") ==
          "x.yaml:4: training.lora: expected a map of rank, alpha, dropout, targets, init_from, "
          "quantize, quant_block, double_quant, "
          "got 8");
    CHECK(error_of(kMinimal + "training:\n  lora: [8]\n") ==
          "x.yaml:4: training.lora: expected a map of rank, alpha, dropout, targets, init_from, "
          "quantize, quant_block, double_quant, "
          "got a list");
    CHECK(error_of(kMinimal + "training:\n  lora: {rank: 8}\n  lora: {rank: 4}\n") ==
          "x.yaml:5: training.lora: given twice (first at line 4)");
}

TEST_CASE("config: overrides set one part of training.lora or the whole map", "[config]") {
    const std::string file = kLoraBase + "training:\n  lora: {rank: 4, alpha: 32, dropout: 0.1}\n";
    SECTION("one part: the others keep their values") {
        const LoraConfig lora = parse(file, "x.yaml",
                                      {"training.lora.rank=8", "training.lora.targets=[qkv,fc]",
                                       "training.lora.init_from=a.safetensors"})
                                    .training.lora;
        CHECK(lora.rank == 8);
        CHECK(lora.alpha == 32.0);
        CHECK(lora.dropout == 0.1);
        CHECK(lora.targets == std::vector<LoraTarget>{LoraTarget::qkv, LoraTarget::fc});
        CHECK(lora.init_from == "a.safetensors");

        const LoraConfig more =
            parse(kLoraBase, "x.yaml",
                  {"training.lora.alpha=8", "training.lora.dropout=0.05",
                   "training.lora.init_from=null", "training.lora.targets=[fc_proj]"})
                .training.lora;
        CHECK(more.rank == 0);
        CHECK(more.alpha == 8.0);
        CHECK(more.dropout == 0.05);
        CHECK_FALSE(more.init_from);
        CHECK(more.targets == std::vector<LoraTarget>{LoraTarget::fc_proj});
    }
    SECTION("the whole map: as in a file, parts left out take their defaults") {
        LoraConfig expected;
        expected.rank = 8;
        expected.alpha = 32.0;
        CHECK(parse(file, "x.yaml", {"training.lora={rank: 8, alpha: 32}"}).training.lora ==
              expected);
        CHECK(parse(file, "x.yaml", {"training.lora=null"}).training.lora == LoraConfig{});
        CHECK(parse(file, "x.yaml", {"training.lora={}"}).training.lora == LoraConfig{});
        // A part after the map changes that part of it.
        expected.dropout = 0.2;
        CHECK(parse(kLoraBase, "x.yaml",
                    {"training.lora={rank: 8, alpha: 32}", "training.lora.dropout=0.2"})
                  .training.lora == expected);
    }
    SECTION("errors name the part") {
        CHECK(error_of(kLoraBase, {"training.lora.rank=-1"}) ==
              "--set training.lora.rank=-1: training.lora.rank: must be >= 0, got -1");
        CHECK(error_of(kLoraBase, {"training.lora.rnak=8"}) ==
              "--set training.lora.rnak=8: training.lora.rnak: unknown key (did you mean "
              "training.lora.rank?)");
        CHECK(error_of(kLoraBase, {"training.lora.targets=[qkv,qkv]"}) ==
              "--set training.lora.targets=[qkv,qkv]: training.lora.targets: qkv given twice");
        CHECK(error_of(kLoraBase, {"training.lora.dropout=1"}) ==
              "--set training.lora.dropout=1: training.lora.dropout: must be in [0, 1), got 1");
        CHECK(error_of(kLoraBase, {"training.lora={rank: 8, alhpa: 2}"}) ==
              "--set training.lora={rank: 8, alhpa: 2}: training.lora.alhpa: unknown key (did you "
              "mean training.lora.alpha?)");
        CHECK(error_of(kLoraBase, {"training.lora={rank: 8, rank: 4}"}) ==
              "--set training.lora={rank: 8, rank: 4}: training.lora.rank: given twice");
        CHECK(error_of(kLoraBase, {"training.lora=8"}) ==
              "--set training.lora=8: training.lora: expected a map of rank, alpha, dropout, "
              "targets, init_from, quantize, quant_block, double_quant, got 8");
    }
}

TEST_CASE("config: training.lora is written as one flow map and read back", "[config]") {
    CHECK(to_yaml(parse(kLoraBase, "x.yaml"))
              .find("\n  lora: {rank: 0, alpha: 16.0, dropout: 0.0, targets: [qkv, attn_proj, fc, "
                    "fc_proj], init_from: null, quantize: none, quant_block: 64, double_quant: "
                    "true}\n") != std::string::npos);

    const Config set =
        parse(kLoraBase, "x.yaml",
              {"training.lora.rank=8", "training.lora.alpha=0.5", "training.lora.dropout=0.05",
               "training.lora.targets=[fc_proj, qkv]",
               "training.lora.init_from='a: \"b\" #1.safetensors'", "training.lora.quantize=nf4",
               "training.lora.quant_block=32", "training.lora.double_quant=false"});
    CHECK(set.training.lora.init_from == "a: \"b\" #1.safetensors");
    const std::string yaml = to_yaml(set);
    INFO(yaml);
    CHECK(yaml.find("\n  lora: {rank: 8, alpha: 0.5, dropout: 0.05, targets: [fc_proj, qkv], "
                    "init_from: \"a: \\\"b\\\" #1.safetensors\", quantize: nf4, quant_block: "
                    "32, double_quant: false}\n") != std::string::npos);
    CHECK(parse(yaml, "x.yaml") == set);
}

TEST_CASE("config: training.lora against the other keys", "[config]") {
    SECTION("every ZeRO stage trains adapters") {
        for (const char* stage : {"0", "1", "2", "3"}) {
            INFO(stage);
            CHECK(parse(kLoraBase, "x.yaml",
                        {std::string("parallel.zero_stage=") + stage, "training.lora.rank=8"})
                      .training.lora.rank == 8);
        }
    }
    SECTION("the rank is at most model.hidden") {
        const std::string model =
            kMinimal + "model: {hidden: 64, heads: 4, init_from: base.safetensors}\n";
        CHECK(parse(model + "training:\n  lora: {rank: 64}\n", "x.yaml").training.lora.rank == 64);
        CHECK(error_of(model + "training:\n  lora: {rank: 65}\n") ==
              "x.yaml:5: training.lora.rank (65) must not exceed model.hidden (64)");
        CHECK(error_of(model + "training:\n  lora: {rank: 64}\n", {"model.hidden=32"}) ==
              "--set model.hidden=32: training.lora.rank (64) must not exceed model.hidden (32)");
    }
    SECTION("init_from needs adapters") {
        CHECK(error_of(kMinimal + "training:\n  lora:\n    init_from: a.safetensors\n") ==
              "x.yaml:5: training.lora.init_from needs training.lora.rank > 0");
        CHECK(error_of(kMinimal + "training:\n  lora: {rank: 4, init_from: a.safetensors}\n",
                       {"training.lora.rank=0"}) ==
              "--set training.lora.rank=0: training.lora.init_from needs training.lora.rank > 0");
        CHECK(error_of(kMinimal, {"training.lora={init_from: a.safetensors}"}) ==
              "--set training.lora={init_from: a.safetensors}: training.lora.init_from needs "
              "training.lora.rank > 0");
        CHECK(
            parse(kLoraBase + "training:\n  lora: {rank: 4, init_from: a.safetensors}\n", "x.yaml")
                .training.lora.init_from == "a.safetensors");
    }
    SECTION("training adapters needs the weights they adapt, bench and plan do not") {
        const std::string message =
            "training.lora.rank > 0 adapts given weights: set model.init_from (Hugging Face "
            "GPT-2 safetensors, or a checkpoint to fine-tune)";
        CHECK(error_of(kMinimal + "training:\n  lora: {rank: 4}\n") == "x.yaml:4: " + message);
        CHECK(error_of(kLoraBase, {"training.lora.rank=4", "model.init_from=null"}) ==
              "--set model.init_from=null: " + message);
        for (const Purpose purpose : {Purpose::bench, Purpose::plan})
            CHECK(parse(kMinimal, "x.yaml", {"training.lora.rank=4"}, purpose).training.lora.rank ==
                  4);
    }
}

TEST_CASE("optimizer config: defaults and values read", "[config][optimizer]") {
    const Config d = parse(kMinimal, "x.yaml");
    CHECK(d.optimizer.name == OptimizerName::adamw);
    CHECK(d.optimizer.muon == MuonConfig{0.95, true, 5, MuonNsDtype::fp32, MuonScale::moonlight});
    CHECK(d.optimizer.galore == GaloreConfig{128, 200, 0.25});
    const Config c = parse(kMinimal +
                               "optimizer:\n  name: muon\n"
                               "  muon: {momentum: 0.9, nesterov: false, ns_steps: 3, "
                               "ns_dtype: bf16, scale: spectral}\n",
                           "x.yaml");
    CHECK(c.optimizer.name == OptimizerName::muon);
    CHECK(c.optimizer.muon == MuonConfig{0.9, false, 3, MuonNsDtype::bf16, MuonScale::spectral});
    const Config g = parse(kMinimal, "x.yaml", {"optimizer.galore.rank=4"});
    CHECK(g.optimizer.galore == GaloreConfig{4, 200, 0.25});
}

TEST_CASE("optimizer config: bad values name the key", "[config][optimizer]") {
    CHECK(error_of(kMinimal + "optimizer:\n  name: mun\n") ==
          "x.yaml:4: optimizer.name: expected one of adamw, muon, galore; got \"mun\" (did you "
          "mean muon?)");
    CHECK(error_of(kMinimal + "optimizer:\n  name: sgd\n") ==
          "x.yaml:4: optimizer.name: expected one of adamw, muon, galore; got \"sgd\"");
    CHECK(error_of(kMinimal, {"optimizer.muon.ns_steps=0"}) ==
          "--set optimizer.muon.ns_steps=0: optimizer.muon.ns_steps: must be >= 1, got 0");
    CHECK(error_of(kMinimal, {"optimizer.muon.momentum=1"}) ==
          "--set optimizer.muon.momentum=1: optimizer.muon.momentum: must be in [0, 1), got 1");
    CHECK(error_of(kMinimal, {"optimizer.muon.momentum=-0.1"}) ==
          "--set optimizer.muon.momentum=-0.1: optimizer.muon.momentum: must be in [0, 1), got "
          "-0.1");
    CHECK(error_of(kMinimal, {"optimizer.muon.scale=unit"}) ==
          "--set optimizer.muon.scale=unit: optimizer.muon.scale: expected one of moonlight, "
          "spectral; got \"unit\"");
    CHECK(error_of(kMinimal, {"optimizer.muon.ns_dtype=fp16"}) ==
          "--set optimizer.muon.ns_dtype=fp16: optimizer.muon.ns_dtype: expected one of fp32, "
          "bf16; got \"fp16\"");
    CHECK(error_of(kMinimal, {"optimizer.galore.rank=0"}) ==
          "--set optimizer.galore.rank=0: optimizer.galore.rank: must be >= 1, got 0");
    CHECK(error_of(kMinimal, {"optimizer.galore.update_gap=0"}) ==
          "--set optimizer.galore.update_gap=0: optimizer.galore.update_gap: must be >= 1, got 0");
}

TEST_CASE("optimizer config: what a matrix optimizer runs with and what it refuses",
          "[config][optimizer]") {
    const std::string muon = kMinimal + "optimizer:\n  name: muon\n";
    CHECK_NOTHROW(parse(muon + "  offload: host\n", "x.yaml"));
    CHECK(error_of(muon + "model:\n  init_from: base.safetensors\n", {"training.lora.rank=4"}) ==
          "--set training.lora.rank=4: optimizer.name: muon with training.lora.rank > 0: "
          "adapters train with AdamW (optimizer.name: adamw)");
    const std::string galore = kMinimal + "optimizer:\n  name: galore\n";
    CHECK_NOTHROW(parse(galore + "  offload: nvme\n  offload_dir: /tmp\n", "x.yaml"));
    CHECK(error_of(galore + "model:\n  init_from: base.safetensors\n", {"training.lora.rank=4"}) ==
          "--set training.lora.rank=4: optimizer.name: galore with training.lora.rank > 0: "
          "adapters train with AdamW (optimizer.name: adamw)");
}
