// Training checkpoints: SHA-256 against FIPS 180's vectors, the manifest, exact resume through
// the binary (2N steps against N + N resumed, bitwise, in fp32, bf16 and fp16), corrupt and
// incomplete checkpoints found and passed over, a process killed mid-save, and export of a
// checkpoint that loads back into the very same model. Multi-rank resume, resharding and preemption
// are in tests/python/test_checkpoint_parallel.py.
#include <array>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_support.h"
#include "config/config.h"
#include "config/model_shape.h"
#include "io/sha256.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "model/hf_gpt2.h"
#include "model/param_layout.h"
#include "solo_grid.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/trainer.h"

using namespace cli;
using namespace trident;
namespace fs = std::filesystem;

namespace {

RunResult checked(const std::string& args) {
    const RunResult r = run(args);
    INFO(args << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return r;
}

// Flips one bit in the middle of a file.
void flip_byte(const fs::path& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(path) / 2);
    f.seekg(middle);
    char c = 0;
    f.get(c);
    f.seekp(middle);
    f.put(static_cast<char>(c ^ 0x10));
}

const train::SampleFn kRandomTokens = [](uint64_t k, std::span<int32_t> in,
                                         std::span<int32_t> tgt) {
    for (std::size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<int32_t>(kernels::hash64(k, i) % 64);
        tgt[i] = static_cast<int32_t>(kernels::hash64(k, i + 1) % 64);
    }
};

}  // namespace

TEST_CASE("sha256: the FIPS 180 test vectors", "[checkpoint]") {
    CHECK(io::sha256_hex("abc") ==
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(io::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(io::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    // A million 'a's fed in uneven pieces: the block boundary falls everywhere.
    io::Sha256 sha;
    const std::string piece(997, 'a');
    std::size_t left = 1000000;
    while (left > 0) {
        const std::size_t n = std::min(left, piece.size());
        sha.update(piece.data(), n);
        left -= n;
    }
    CHECK(sha.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("checkpoint: the manifest reads back as written", "[checkpoint]") {
    Workspace ws;
    train::Manifest m;
    m.step = 400;
    m.samples_consumed = 400 * 32;
    m.seed = 18446744073709551557ull;  // beyond int64
    m.adam_step = 398;
    m.loss_scale = 0.000030517578125;  // 2^-15, exactly
    m.good_steps = 17;
    m.skipped_total = 2;
    m.shape = model::GptShape{300, 384, 16, 2, 32, 4, 128, 4};
    m.layout = train::CheckpointLayout{2, 2, 2, 2, "interleaved", 0, 4096, {1, 0, 0, 1}};
    m.precision = "fp16";
    m.files = {
        {"config.yaml", -1, -1, -1, 1234, std::string(64, 'a'), ""},
        {"pp1_tp0_dp1.safetensors", 1, 0, 1, 99, std::string(64, 'b'), std::string(64, 'c')}};
    fs::create_directories(ws.path("step"));
    std::ofstream(fs::path(ws.path("step")) / train::kManifestName) << train::manifest_json(m);
    const train::Manifest back = train::read_manifest(ws.path("step"));
    CHECK(back.step == m.step);
    CHECK(back.samples_consumed == m.samples_consumed);
    CHECK(back.seed == m.seed);
    CHECK(back.adam_step == m.adam_step);
    CHECK(back.loss_scale == m.loss_scale);
    CHECK(back.good_steps == m.good_steps);
    CHECK(back.skipped_total == m.skipped_total);
    CHECK(back.shape.padded_vocab == 384);
    CHECK(back.shape.ffn == 128);
    CHECK(back.layout.schedule == "interleaved");
    CHECK(back.layout.bucket_size == 4096);
    CHECK(back.layout.zero_stage == 0);
    CHECK(back.layout.chunk_layers == std::vector<int>{1, 0, 0, 1});
    CHECK(back.precision == "fp16");
    REQUIRE(back.files.size() == 2);
    CHECK(back.files[0].pp == -1);
    CHECK(back.files[1].name == "pp1_tp0_dp1.safetensors");
    CHECK(back.files[1].dp == 1);
    CHECK(back.files[0].header_sha256.empty());
    CHECK(back.files[1].header_sha256 == std::string(64, 'c'));
    CHECK(back.files[1].sha256 == std::string(64, 'b'));

    std::ofstream(fs::path(ws.path("step")) / train::kManifestName) << "{\"format\": \"other\"}";
    REQUIRE_THROWS_WITH(
        train::read_manifest(ws.path("step")),
        Catch::Contains("manifest.json") && Catch::Contains("missing \"version\"") ||
            Catch::Contains("not a Trident checkpoint"));
}

TEST_CASE("checkpoint: every manifest field out of its range is refused, naming it",
          "[checkpoint]") {
    Workspace ws;
    train::Manifest m;
    m.step = 400;
    m.samples_consumed = 400 * 32;
    m.adam_step = 398;
    m.good_steps = 17;
    m.skipped_total = 2;
    m.shape = model::GptShape{300, 384, 16, 2, 32, 4, 128, 4};
    m.layout = train::CheckpointLayout{2, 2, 2, 1, "1f1b", 1, 4096, {1, 1}};
    m.precision = "fp32";
    m.files = {{"pp1_tp0_dp1.safetensors", 1, 0, 1, 99, std::string(64, 'b'), ""}};
    const std::string good = train::manifest_json(m);
    fs::create_directories(ws.path("step"));
    const auto write = [&](const std::string& text) {
        std::ofstream(fs::path(ws.path("step")) / train::kManifestName) << text;
    };
    write(good);
    CHECK_NOTHROW(train::read_manifest(ws.path("step")));
    // (the text as written, its replacement, what the message says)
    const std::vector<std::array<std::string, 3>> cases = {
        {"\"adam_step\": 398", "\"adam_step\": -1", "\"adam_step\" is -1, outside [0, 400]"},
        {"\"adam_step\": 398", "\"adam_step\": 401", "\"adam_step\" is 401, outside [0, 400]"},
        {"\"step\": 400", "\"step\": 0", "\"step\" is 0, outside [1, 2147483647]"},
        {"\"samples_consumed\": 12800", "\"samples_consumed\": -5", "\"samples_consumed\" is -5"},
        {"\"seed\": \"0\"", "\"seed\": \"-1\"", "\"seed\" is not a number"},
        {"\"loss_scale\": 1", "\"loss_scale\": -1", "\"loss_scale\" is not a positive"},
        {"\"good_steps\": 17", "\"good_steps\": -3", "\"good_steps\" is -3"},
        {"\"skipped_total\": 2", "\"skipped_total\": 9999", "\"skipped_total\" is 9999"},
        {"\"layers\": 2", "\"layers\": 1000000000", "\"layers\" is 1000000000, outside [1, 4096]"},
        {"\"vocab_size\": 300", "\"vocab_size\": -2", "\"vocab_size\" is -2"},
        {"\"hidden\": 32", "\"hidden\": 30", "\"heads\" does not divide \"hidden\""},
        {"\"kv_heads\": 4", "\"kv_heads\": 3", "\"kv_heads\" does not divide \"heads\""},
        {"\"kv_heads\": 4", "\"kv_heads\": 0", "\"kv_heads\" is 0, outside [1, 4]"},
        {"\"arch\": \"gpt2\"", "\"arch\": \"gpt5\"", "\"arch\" is \"gpt5\", not gpt2 or llama"},
        {"\"pipeline\": 2", "\"pipeline\": 2147483647", "\"pipeline\" is 2147483647"},
        {"\"virtual_stages\": 1", "\"virtual_stages\": 1073741824", "\"virtual_stages\" is"},
        {"\"virtual_stages\": 1", "\"virtual_stages\": 3", "\"chunk_layers\" does not cut"},
        {"\"tensor\": 2", "\"tensor\": 0", "\"tensor\" is 0"},
        {"\"zero_stage\": 1", "\"zero_stage\": 7", "\"zero_stage\" is 7, outside [0, 3]"},
        {"\"bucket_size\": 4096", "\"bucket_size\": -1", "\"bucket_size\" is -1"},
        {"\"precision\": \"fp32\"", "\"precision\": \"fp8\"", "\"precision\" is \"fp8\""},
        {"\"pp\": 1", "\"pp\": 2", "\"pp\" is 2, outside [0, 1]"},
        {"\"bytes\": 99", "\"bytes\": -99", "\"bytes\" is -99"},
    };
    for (const auto& [from, to, message] : cases) {
        const std::size_t at = good.find(from);
        INFO(from << " -> " << to);
        REQUIRE(at != std::string::npos);
        write(std::string(good).replace(at, from.size(), to));
        CHECK_THROWS_WITH(train::read_manifest(ws.path("step")),
                          Catch::Contains("manifest.json: " + message));
    }
}

TEST_CASE("checkpoint: for_each_slice_run places every slice element where unshard_params does",
          "[checkpoint]") {
    const model::GptShape shape{300, 384, 16, 2, 32, 4, 128, 4};
    const model::ParamLayout full(shape);
    for (int tp = 0; tp < 2; ++tp) {
        const model::ParamLayout local(shape, tp, 2, model::StagePlan{2, 1, 1, {}});
        std::vector<float> values(local.total());
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i + 1);
        std::vector<float> whole(full.total(), 0.0f);
        model::unshard_params(local, values.data(), full, whole.data());
        for (const model::ParamTensor& t : local.tensors()) {
            std::size_t covered = 0;
            model::for_each_slice_run(t, tp, [&](std::size_t l, std::size_t f, std::size_t n) {
                for (std::size_t i = 0; i < n; ++i)
                    REQUIRE(whole[full.find(t.name)->offset + f + i] == values[t.offset + l + i]);
                covered += n;
            });
            REQUIRE(covered == t.numel);
        }
    }
}

TEST_CASE(
    "checkpoint: with fewer key/value heads than tensor ranks each head's rows are "
    "held by its replicas and spoken for once",
    "[checkpoint]") {
    const int kv_heads = GENERATE(1, 2), M = GENERATE(2, 4);
    const model::GptShape shape{300, 512, 16, 2, 32, 4, 48, kv_heads, model::Arch::llama, false};
    const model::ParamLayout full(shape);
    std::vector<float> whole(full.total());
    for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i + 1);
    // The ranks' shares of the whole, summed: every element exactly once.
    std::vector<float> sum(full.total(), 0.0f);
    for (int tp = 0; tp < M; ++tp) {
        const model::ParamLayout local(shape, tp, M);
        const model::ParamTensor& k = *local.find("layers.0.self_attn.k_proj.weight");
        const int replicas = M > kv_heads ? M / kv_heads : 1;
        CHECK(k.replicas == replicas);
        CHECK(k.shape == std::vector<int64_t>{8 * kv_heads * replicas / M, 32});  // d = 8
        CHECK(local.held_elsewhere(k) == (tp % replicas != 0));
        std::vector<float> mine(local.total());
        model::shard_params(full, whole.data(), local, mine.data());
        const std::vector<float> share = model::share_of_whole(local, mine, full);
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += share[i];
    }
    CHECK(sum == whole);
}

TEST_CASE("checkpoint: resuming gives the uninterrupted run's losses bitwise", "[checkpoint]") {
    const std::string precision = GENERATE("fp32", "bf16", "fp16");
    Workspace ws;
    // The whole run keeps a checkpoint every 3 steps; a new process resumes from the first.
    const std::string common = "--set training.precision=" + precision + " --set training.steps=6";
    checked(
        ws.train(common + " --set checkpoint.dir=" + ws.path("ck") +
                 " --set checkpoint.interval=3 --set logging.metrics=" + ws.path("full.jsonl")));
    const std::string half = ws.path("ck") + "/step_000003";
    const RunResult resumed = checked(ws.train(common + " --set checkpoint.resume=" + half +
                                               " --set checkpoint.dir=" + ws.path("ck2") +
                                               " --set logging.metrics=" + ws.path("b.jsonl")));
    REQUIRE(resumed.output.find("resumed: " + half + " at step 3") != std::string::npos);
    const auto full = losses_of(ws.path("full.jsonl"));
    REQUIRE(losses_of(ws.path("b.jsonl")) ==
            std::vector<std::string>(full.begin() + 3, full.end()));

    const RunResult info = checked("checkpoint info " + ws.path("ck"));
    CHECK(info.output.find("step_000006") != std::string::npos);
    CHECK(info.output.find("precision: " + precision) != std::string::npos);
    CHECK(info.output.find("all 2 files match their checksums") != std::string::npos);
}

TEST_CASE("checkpoint: a corrupt or incomplete checkpoint is reported and passed over",
          "[checkpoint]") {
    Workspace ws;
    const std::string ck = " --set checkpoint.dir=" + ws.path("ck") +
                           " --set checkpoint.interval=2 --set training.steps=8";
    checked(ws.train(ck + " --set logging.metrics=" + ws.path("full.jsonl")));
    const fs::path dir(ws.path("ck"));
    REQUIRE(train::list_checkpoints(dir.string()).size() == 3);  // 4, 6, 8 (keep: 3)

    // A save killed midway left its temporary directory; a flipped byte in the newest
    // checkpoint, a missing shard in the one before.
    fs::create_directories(dir / ".tmp_step_000010");
    std::ofstream(dir / ".tmp_step_000010" / "pp0_tp0_dp0.safetensors") << "half a shard";
    flip_byte(dir / "step_000008" / "pp0_tp0_dp0.safetensors");
    fs::remove(dir / "step_000006" / "pp0_tp0_dp0.safetensors");

    const RunResult info = run("checkpoint info " + (dir / "step_000008").string());
    require_clear_error(info, "fail their check");
    CHECK(info.output.find("CORRUPT") != std::string::npos);
    require_clear_error(
        run(ws.train(ck + " --set checkpoint.resume=" + (dir / "step_000008").string())),
        "step_000008/pp0_tp0_dp0.safetensors: SHA-256 does not match");

    // resume: auto names each bad one and goes back to step 4, then matches the whole run.
    const RunResult r = checked(ws.train(ck + " --set logging.metrics=" + ws.path("b.jsonl")));
    CHECK(r.output.find("step_000008 is unusable") != std::string::npos);
    CHECK(r.output.find("step_000008/pp0_tp0_dp0.safetensors: SHA-256 does not match") !=
          std::string::npos);
    CHECK(r.output.find("step_000006/pp0_tp0_dp0.safetensors: missing") != std::string::npos);
    CHECK(r.output.find("resumed: " + (dir / "step_000004").string()) != std::string::npos);
    const auto full = losses_of(ws.path("full.jsonl"));
    REQUIRE(losses_of(ws.path("b.jsonl")) ==
            std::vector<std::string>(full.begin() + 4, full.end()));
    // The new saves replaced the bad ones and cleared the interrupted save.
    CHECK(!fs::exists(dir / ".tmp_step_000010"));
    checked("checkpoint info " + (dir / "step_000006").string());
    checked("checkpoint info " + (dir / "step_000008").string());

    // With every checkpoint unusable there is nothing to resume: a clear error, not a fresh start.
    for (const std::string& step : train::list_checkpoints(dir.string()))
        flip_byte(fs::path(step) / "pp0_tp0_dp0.safetensors");
    require_clear_error(run(ws.train(ck + " --set training.steps=10")), "is usable");
}

TEST_CASE("checkpoint: a process killed mid-save leaves the checkpoint before it to resume",
          "[checkpoint]") {
    Workspace ws;
    const std::string ck =
        " --set checkpoint.dir=" + ws.path("ck") + " --set checkpoint.interval=1";
    checked(ws.train("--set logging.metrics=" + ws.path("full.jsonl")));
    // The test fault: in the save of step 2 the process halves its shard and dies by SIGKILL.
    const RunResult killed = run_shell("TRIDENT_TEST_CRASH_IN_SAVE=2:0 " +
                                       std::string(TRIDENT_BINARY) + " " + ws.train(ck));
    INFO(killed.output);
    REQUIRE(killed.exit_code == 128 + 9);  // the shell's report of a SIGKILL
    const fs::path dir = ws.path("ck");
    const fs::path torn = dir / ".tmp_step_000002" / "pp0_tp0_dp0.safetensors";
    REQUIRE(fs::exists(torn));
    CHECK(fs::file_size(torn) ==
          fs::file_size(dir / "step_000001" / "pp0_tp0_dp0.safetensors") / 2);
    CHECK_FALSE(fs::exists(dir / ".tmp_step_000002" / "manifest.json"));
    CHECK_FALSE(fs::exists(dir / "step_000002"));
    checked("checkpoint info " + (dir / "step_000001").string());

    const RunResult resumed =
        checked(ws.train(ck + " --set logging.metrics=" + ws.path("r.jsonl")));
    CHECK(resumed.output.find("resumed: " + (dir / "step_000001").string() + " at step 1") !=
          std::string::npos);
    const auto full = losses_of(ws.path("full.jsonl"));
    CHECK(losses_of(ws.path("r.jsonl")) == std::vector<std::string>(full.begin() + 1, full.end()));
    CHECK_FALSE(fs::exists(dir / ".tmp_step_000002"));  // the next save cleared it

    require_clear_error(run_shell("TRIDENT_TEST_CRASH_IN_SAVE=2 " + std::string(TRIDENT_BINARY) +
                                  " " + ws.train(" --set checkpoint.dir=" + ws.path("ck3"))),
                        "TRIDENT_TEST_CRASH_IN_SAVE: expected STEP:RANK (e.g. 6:1), got '2'");
}

TEST_CASE("checkpoint: export writes the model that loads back with the same loss",
          "[checkpoint]") {
    Workspace ws;
    checked(ws.train("--set training.precision=bf16 --set checkpoint.dir=" + ws.path("ck")));
    checked("export --checkpoint " + ws.path("ck") + " --output " + ws.path("w.safetensors"));

    const train::LoadedModel loaded = train::load_model_checkpoint(ws.path("ck"));
    config::Config cfg =
        config::load(ws.path("ck") + "/step_000003/config.yaml", {"training.precision=fp32"});
    auto ops = kernels::make_cpu_ops(1);
    train::Trainer restored(cfg, *ops, test::solo_grid());
    train::restore_checkpoint(train::read_share(loaded.path, restored.model().layout(),
                                                restored.data_parallel().owned_ranges()),
                              restored);
    train::Trainer imported(cfg, *ops, test::solo_grid());
    const model::ParamLayout whole(config::gpt_shape(cfg));
    std::vector<float> weights(whole.total());
    model::load_hf_gpt2(ws.path("w.safetensors"), whole, weights.data());
    REQUIRE(weights == loaded.params);  // the fp32 master weights, exactly
    imported.model().weights().load_whole(weights);
    const int sequences = 2 * cfg.training.micro_batch;
    REQUIRE(imported.evaluate(kRandomTokens, sequences) ==
            restored.evaluate(kRandomTokens, sequences));

    // And through the binary: model.init_from takes it.
    checked(ws.train("--set model.init_from=" + ws.path("w.safetensors")));
}
