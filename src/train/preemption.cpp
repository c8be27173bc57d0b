// Signal handlers that record a preemption or an interruption (see preemption.h).
#include "train/preemption.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace trident::train {

namespace {

volatile std::sig_atomic_t received = 0;
volatile std::sig_atomic_t interrupts = 0;
volatile std::sig_atomic_t speaker = 1;
volatile std::sig_atomic_t saves = 1;

// Only async-signal-safe calls here: write(2), signal(2), raise(3).
void say(const char* text) {
    if (speaker) {
        const ssize_t written = ::write(STDERR_FILENO, text, std::strlen(text));
        (void)written;  // nothing to do about a stderr that cannot be written
    }
}

extern "C" void on_preemption_signal(int signal) {
    if (received == 0) received = signal;
}

extern "C" void on_interrupt(int signal) {
    const bool again = interrupts != 0;
    interrupts = 1;
    if (again) {
        say("\ntrident: a second Ctrl-C: aborted without saving\n");
        std::signal(SIGINT, SIG_DFL);
        std::raise(SIGINT);
        return;
    }
    if (received == 0) received = signal;
    say(saves ? "\ntrident: Ctrl-C: stopping after the step under way, with a checkpoint; press "
                "Ctrl-C again to abort without saving\n"
              : "\ntrident: Ctrl-C: stopping after the step under way (checkpoint.dir is not set: "
                "nothing is saved); press Ctrl-C again to abort at once\n");
}

}  // namespace

void install_preemption_handlers() {
    struct sigaction action = {};
    action.sa_handler = on_preemption_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGUSR1, &action, nullptr);
    // A process started with SIGINT ignored (nohup, `&` in a script) keeps ignoring it, as
    // the shell meant: a Ctrl-C at the terminal is not for it.
    struct sigaction before = {};
    if (sigaction(SIGINT, nullptr, &before) == 0 && before.sa_handler == SIG_IGN) return;
    action.sa_handler = on_interrupt;
    sigaction(SIGINT, &action, nullptr);
}

void set_interrupt_speaker(bool speaks) {
    speaker = speaks ? 1 : 0;
}

void set_interrupt_saves(bool saving) {
    saves = saving ? 1 : 0;
}

int preemption_signal() {
    return received;
}

}  // namespace trident::train
