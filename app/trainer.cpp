#include "app/trainer.h"

#include "kernels/error.h"

namespace cnn {

int run_training(const TrainConfig&, const TrainArgs&) { CNN_FAIL("training is not built yet"); }
int run_check_data(const TrainConfig&) { CNN_FAIL("--check-data is not built yet"); }

}  // namespace cnn
