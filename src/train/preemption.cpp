// Signal handlers that record a preemption request (see preemption.h).
#include "train/preemption.h"

#include <csignal>

namespace trident::train {

namespace {

volatile std::sig_atomic_t received = 0;

extern "C" void on_preemption_signal(int signal) {
    if (received == 0) received = signal;
}

}  // namespace

void install_preemption_handlers() {
    struct sigaction action = {};
    action.sa_handler = on_preemption_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGUSR1, &action, nullptr);
}

int preemption_signal() {
    return received;
}

}  // namespace trident::train
