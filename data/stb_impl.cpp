// The one translation unit that compiles stb_image and stb_image_resize (Debian's libstb-dev
// ships headers only). Only the decoders we accept are compiled in, which keeps the attack
// surface small; HDR stays so that such files are recognized and refused with a reason.
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_JPEG
#define STBI_ONLY_HDR
#define STBI_FAILURE_USERMSG
#include <stb_image.h>

#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb_image_resize.h>
