// The optimizers by name (optimizer.name): each one implementation of optim/optimizer.h.
#include "optim/adamw.h"
#include "optim/galore.h"
#include "optim/muon.h"

namespace trident::optim {

std::unique_ptr<Optimizer> make_optimizer(const config::TrainingConfig& t,
                                          const config::OptimizerConfig& o) {
    const auto beta1 = static_cast<float>(t.beta1), beta2 = static_cast<float>(t.beta2),
               eps = static_cast<float>(t.eps);
    switch (o.name) {
        case config::OptimizerName::muon:
            return std::make_unique<Muon>(o.muon, AdamW(beta1, beta2, eps));
        case config::OptimizerName::galore:
            return std::make_unique<Galore>(o.galore, AdamW(beta1, beta2, eps), beta1, beta2, eps);
        case config::OptimizerName::adamw:
            break;
    }
    return std::make_unique<AdamW>(beta1, beta2, eps);
}

}  // namespace trident::optim
