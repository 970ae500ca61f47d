// ./infer: not built yet beyond its command line (see the open issues).
#include <CLI/CLI.hpp>

#include "app/cli_common.h"
#include "kernels/error.h"

int main(int argc, char** argv) {
  return cnn::run_main("infer", [&] {
    CLI::App app{"infer"};
    app.set_version_flag("--version", cnn::version_string("infer"));
    CLI11_PARSE(app, argc, argv);
    CNN_FAIL("infer is not implemented yet");
    return 0;
  });
}
