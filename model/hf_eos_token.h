// A Hugging Face folder's end-of-sequence token from its tokenizer files, for a config.json that
// names no eos_token_id (data.eod_token's default for a llama; docs/ARCHITECTURE.md "Packed
// documents").
//
// tokenizer_config.json (transformers' PreTrainedTokenizer settings) holds either an integer
// "eos_token_id" or the token's text as "eos_token": a string, or an object whose "content" is
// it (an AddedToken as older transformers wrote it). The text's id is the one
// tokenizer_config.json's "added_tokens_decoder" ({"2": {"content": "</s>"}}) gives it, else
// tokenizer.json's "added_tokens" ([{"id": 2, "content": "</s>"}]), else its "model"'s "vocab".
#pragma once

#include <string>

namespace trident::model {

// The eos token id of the folder `dir`'s tokenizer_config.json; -1 when the folder has no such
// file or it names none. Throws trident::Error naming the file for a token whose id neither file
// gives, or for files that are not JSON objects.
int read_hf_eos_token(const std::string& dir);

}  // namespace trident::model
