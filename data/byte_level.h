// GPT-2's byte-to-unicode mapping (openai/gpt-2, src/encoder.py, bytes_to_unicode), in which
// byte-level BPE vocabularies spell their tokens (GPT-2's encoder.json and vocab.bpe, the vocab
// and merges of a tokenizer.json): the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF
// stand for themselves, the other 68 bytes, in increasing order, for U+0100, U+0101, ...
#pragma once

#include <string>
#include <string_view>

namespace trident::data {

// The bytes a token string (UTF-8) stands for. Throws trident::Error with a bare reason naming
// the token if it is empty, not UTF-8, or has a character that stands for no byte.
std::string byte_level_bytes(std::string_view token);

}  // namespace trident::data
