// The error of a token stream whose file changed under a run (see token_stream.h).
#include "data/token_stream.h"

#include "kernels/error.h"

namespace trident::data {

void token_changed(const std::string& what, const std::string& path, std::size_t byte, int64_t id,
                   int vocab_size) {
    throw Error(what + ": " + path + ": token id " + std::to_string(id) + " at byte " +
                std::to_string(byte) +
                " is outside the vocabulary (model.vocab_size = " + std::to_string(vocab_size) +
                "); it was inside when the run opened the file, so the file changed while this "
                "run read it (rewritten in place); restore it and resume from the last "
                "checkpoint");
}

}  // namespace trident::data
