// Packed documents (data.documents: mask, docs/ARCHITECTURE.md "Packed documents"): the
// documents of one microbatch's windows, found from its input tokens, and what the parts need
// of them. A document ends after each eod token (the eod is its last token); a window's first
// token starts one. Token i of a window sees token j <= i only when no eod lies at a position in
// [j, i): j at or after the start of i's document. Positions restart at 0 at each document's
// start (GPT-2's learned position embedding, a llama's rotary angle). With mask_eod_loss a
// position whose input token is eod counts no loss.
//
// Shapes: B sequences of T tokens, rows n = b·T + t (N = B·T). `starts` and `positions` are
// (N) int32, on the device for the kernels and on the host; `uncounted` the rows whose loss
// does not count, ascending. Under context parallelism a rank holds T of each window's S
// tokens: the starts are the whole windows' (B·S, for the attention over whole sequences), the
// positions and uncounted rows its own rows'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "model/part_context.h"

namespace trident::model {

// data.documents, data.eod_token and data.mask_eod_loss as the model takes them.
struct DocumentOptions {
    bool mask = false;  // attention within documents, positions per document
    int eod = -1;       // the token that ends a document
    bool mask_eod_loss = false;
    // Whether any microbatch needs its documents: the mask, or the loss's mask alone.
    bool any() const { return mask || mask_eod_loss; }
};

// The first row (within its sequence) of each row's document, over B windows of T tokens.
std::vector<int32_t> document_starts(const int32_t* tokens, int B, int T, int eod);
// The rows of B windows of T tokens whose input token is eod.
std::vector<int32_t> eod_rows(const int32_t* tokens, int B, int T, int eod);
// The positions in the window that count a loss: T less the eod inputs under mask_eod_loss.
int counted_positions(const int32_t* tokens, int T, const DocumentOptions& o);

// The pass's positions within documents and document starts (N) on the device, or null: none.
const int32_t* document_positions(const Pass& pass);
const int32_t* document_starts(const Pass& pass);
// The document starts of this rank's own rows (N), as window positions; null: none.
const int32_t* document_starts_held(const Pass& pass);

// One microbatch's documents, kept with its activations from its forward to its backward.
class Documents {
public:
    // The device elements (i32) the kernels read under the mask, for B windows of S tokens of
    // which a rank holds T each: starts (B·S), positions (B·T), held starts (B·T). The chunk's
    // set declares them (model/stage_parts.h), so the planner counts them.
    static std::size_t elements(int B, int S, int T);
    // Finds them in `tokens` (B, T) on the host, and copies what the kernels read to `device`
    // (elements(B, T, T); unused without the mask).
    void find(kernels::Ops& ops, const DocumentOptions& o, const int32_t* tokens, int B, int T,
              int32_t* device);
    // The same for a rank holding `local` (B, T): the tokens of whole windows `whole` (B, S) at
    // the window positions `held` (T, context_positions).
    void find_split(kernels::Ops& ops, const DocumentOptions& o, const int32_t* whole,
                    const int32_t* local, int B, int S, std::span<const int32_t> held,
                    int32_t* device);
    // (B·S) on the device: each row's document start; null without the mask.
    const int32_t* starts() const { return mask_ ? device() : nullptr; }
    // (N) on the device: each row's position in its document; null without the mask.
    const int32_t* positions() const { return mask_ ? device() + starts_ : nullptr; }
    // (N) on the device: the document start of each of this rank's rows, as a window position
    // (context parallelism's ring attention); null without the mask.
    const int32_t* held_starts() const { return mask_ ? device() + starts_ + held_ : nullptr; }
    const std::vector<int32_t>& uncounted() const { return uncounted_; }

private:
    const int32_t* device() const { return device_; }

    bool mask_ = false;
    std::size_t starts_ = 0, held_ = 0;  // B·S, B·T
    const int32_t* device_ = nullptr;    // the set's: starts, positions, held starts
    std::vector<int32_t> uncounted_;
};

}  // namespace trident::model
