// The optimizer's keys (optimizer.name, optimizer.muon, optimizer.galore): their defaults, and
// bad input refused with one line naming the key, before anything is built.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/config.h"

using namespace trident::config;

namespace {

const std::string kMinimal = "data:\n  train: data/train.bin\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    try {
        parse(yaml, "x.yaml", overrides);
    } catch (const ConfigError& e) {
        return e.what();
    }
    FAIL("expected a ConfigError for:\n" << yaml);
    return "";
}

}  // namespace

TEST_CASE("optimizer config: defaults and values read", "[config][optimizer]") {
    const Config d = parse(kMinimal, "x.yaml");
    CHECK(d.optimizer.name == OptimizerName::adamw);
    CHECK(d.optimizer.muon == MuonConfig{0.95, true, 5, MuonScale::moonlight});
    CHECK(d.optimizer.galore == GaloreConfig{128, 200, 0.25});
    const Config c = parse(kMinimal +
                               "optimizer:\n  name: muon\n"
                               "  muon: {momentum: 0.9, nesterov: false, ns_steps: 3, "
                               "scale: spectral}\n",
                           "x.yaml");
    CHECK(c.optimizer.name == OptimizerName::muon);
    CHECK(c.optimizer.muon == MuonConfig{0.9, false, 3, MuonScale::spectral});
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
    CHECK(error_of(kMinimal, {"optimizer.galore.rank=0"}) ==
          "--set optimizer.galore.rank=0: optimizer.galore.rank: must be >= 1, got 0");
    CHECK(error_of(kMinimal, {"optimizer.galore.update_gap=0"}) ==
          "--set optimizer.galore.update_gap=0: optimizer.galore.update_gap: must be >= 1, got 0");
}

TEST_CASE("optimizer config: what a matrix optimizer does not run with is refused",
          "[config][optimizer]") {
    const std::string muon = kMinimal + "optimizer:\n  name: muon\n";
    CHECK(error_of(muon + "  offload: host\n") ==
          "x.yaml:5: optimizer.offload: host with optimizer.name: muon is not built: a matrix "
          "optimizer's state stays in device memory");
    CHECK(error_of(muon + "model:\n  init_from: base.safetensors\n", {"training.lora.rank=4"}) ==
          "--set training.lora.rank=4: optimizer.name: muon with training.lora.rank > 0: "
          "adapters train with AdamW (optimizer.name: adamw)");
    CHECK(error_of(kMinimal + "optimizer:\n  name: galore\n") ==
          "x.yaml:4: optimizer.name: galore is not built yet (adamw and muon are)");
}
