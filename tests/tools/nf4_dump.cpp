// The NF4 quantizer (kernels/nf4.h) on a file of fp32 values, for tests/python/test_nf4.py:
// reads IN (raw little-endian fp32, one matrix row by row), quantizes it in blocks of BLOCK
// with or without double quantization (DQ 1 or 0), and writes OUT.codes (the packed codes),
// OUT.absmax (a' per block, fp32) and OUT.weights (the dequantized matrix, fp32).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/nf4.h"

namespace {

template <typename T>
void write(const std::string& path, const std::vector<T>& values) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(T)));
    if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: trident_nf4_dump IN BLOCK DQ OUT\n");
        return 2;
    }
    std::ifstream in(argv[1], std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    std::vector<float> weights(bytes.size() / sizeof(float));
    std::copy(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(weights.size() * 4),
              reinterpret_cast<char*>(weights.data()));
    const auto t = trident::kernels::nf4_quantize(weights, std::strtoul(argv[2], nullptr, 10),
                                                  std::string(argv[3]) == "1");
    std::vector<float> absmax(t.blocks()), dequantized(t.size);
    for (std::size_t b = 0; b < t.blocks(); ++b) absmax[b] = t.block_absmax(b);
    trident::kernels::nf4_dequantize(t, dequantized);
    const std::string out = argv[4];
    write(out + ".codes", t.codes);
    write(out + ".absmax", absmax);
    write(out + ".weights", dequantized);
    return 0;
}
