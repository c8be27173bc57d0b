// A small deterministic mutation fuzzer for the parsers' tests (tests/test_fuzz.cpp): from a
// few valid seed inputs it makes mutated ones the way coverage-guided fuzzers mutate (bit
// flips, bytes set to edge values, integers overwritten with edge values, insertions of
// random bytes or of the format's own tokens, deletions, duplications, truncations and
// splices of two seeds), one to four mutations stacked. A seed fixes the whole sequence, so a
// failure names the iteration that reproduces it. GCC has no libFuzzer; this needs nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fuzz {

class Mutator {
public:
    // `tokens`: strings of the format worth inserting ("{", "\"dtype\"", "-1", ...).
    Mutator(uint64_t seed, std::vector<std::string> tokens)
        : state_(seed), tokens_(std::move(tokens)) {}

    // Iteration i's input from seed inputs (each non-empty).
    std::string mutate(const std::vector<std::string>& seeds) {
        std::string s = seeds[below(seeds.size())];
        const std::size_t rounds = 1 + below(4);
        for (std::size_t r = 0; r < rounds; ++r) mutate_once(s, seeds);
        return s;
    }

    uint64_t next() {  // splitmix64
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }

private:
    void mutate_once(std::string& s, const std::vector<std::string>& seeds) {
        static constexpr unsigned char kEdgeBytes[] = {0x00, 0x01, 0x7F, 0x80, 0xFF, '"', '\\',
                                                       '{',  '}',  '[',  ']',  ':',  ',', '-'};
        static constexpr uint64_t kEdgeIntegers[] = {0,          1,          0x7F,       0x80,
                                                     0xFF,       0x7FFF,     0xFFFF,     0x7FFFFFFF,
                                                     0x80000000, 0xFFFFFFFF, ~0ull >> 1, ~0ull};
        const std::size_t at = below(s.size() + 1);
        switch (below(10)) {
            case 0:  // flip a bit
                if (!s.empty()) s[at % s.size()] ^= static_cast<char>(1u << below(8));
                break;
            case 1:  // an edge byte
                if (!s.empty())
                    s[at % s.size()] = static_cast<char>(kEdgeBytes[below(sizeof kEdgeBytes)]);
                break;
            case 2: {  // an edge integer, little-endian, 1 to 8 bytes wide
                const uint64_t v = kEdgeIntegers[below(std::size(kEdgeIntegers))];
                const std::size_t width = 1 + below(8);
                for (std::size_t i = 0; i < width && at + i < s.size(); ++i)
                    s[at + i] = static_cast<char>(v >> (8 * i));
                break;
            }
            case 3: {  // random bytes
                std::string bytes(1 + below(8), '\0');
                for (char& c : bytes) c = static_cast<char>(next());
                s.insert(at, bytes);
                break;
            }
            case 4:  // a token of the format
                if (!tokens_.empty()) s.insert(at, tokens_[below(tokens_.size())]);
                break;
            case 5:  // delete a run
                s.erase(at, 1 + below(16));
                break;
            case 6: {  // duplicate a run
                const std::string run = s.substr(at, 1 + below(32));
                s.insert(at, run);
                break;
            }
            case 7:  // truncate
                s.resize(at);
                break;
            case 8: {  // splice: this one's start, another seed's end
                const std::string& other = seeds[below(seeds.size())];
                s = s.substr(0, at) + other.substr(std::min(other.size(), below(other.size() + 1)));
                break;
            }
            default:  // swap two bytes
                if (s.size() > 1) std::swap(s[at % s.size()], s[below(s.size())]);
                break;
        }
    }

    uint64_t state_;
    std::vector<std::string> tokens_;
};

}  // namespace fuzz
