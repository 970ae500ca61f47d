// The one translation unit that compiles stb_image and stb_image_resize (Debian's libstb-dev
// ships headers only). Only the decoders we accept are compiled in, which keeps the attack
// surface small; HDR stays so that such files are recognized and refused with a reason.
// Our own pre-checks in image_folder.cpp cover what stb 2.27 gets wrong on hostile files; the
// two settings here are what the fuzzer (fuzz/fuzz_image) found on top of those.
#include <cstdlib>

// Every block stb_image allocates starts zeroed: 2.27 reads memory of a corrupt JPEG's decoder
// state that nothing wrote, so the pixels (and once a UBSan report of a 32-bit shift in its bit
// reader) depended on whatever the heap held before. Zeroed, a file always decodes the same.
#define STBI_MALLOC(size) std::calloc(1, size)
#define STBI_REALLOC(p, size) std::realloc(p, size)
#define STBI_FREE(p) std::free(p)

// stb_image 2.27 calls memcpy(NULL, p, 0) for a PNG whose first IDAT chunk is empty: undefined in
// the letter of the standard, harmless in practice (UBSan "null pointer passed as argument 1").
// Its JPEG bit reader shifts a 32-bit buffer by 32 when a corrupt stream drives its bit count
// negative (stbi__grow_buffer_unsafe; fuzz/corpus/image/jpeg-shift-32.jpg): a register operation
// on already-garbage bits, no memory access. Those two checks are off for stb's code only; ASan
// and every other check stay on.
#ifdef __clang__
#pragma clang attribute push(__attribute__((no_sanitize("nonnull-attribute", "shift"))), \
                             apply_to = function)
#endif
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_JPEG
#define STBI_ONLY_HDR
#define STBI_FAILURE_USERMSG
#include <stb_image.h>

#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb_image_resize.h>
#ifdef __clang__
#pragma clang attribute pop
#endif
