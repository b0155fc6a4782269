#include "apps/gen_data_command.h"

namespace troupe::apps {

void addGenDataCommand(CLI::App* app, int* result) {}

}  // namespace troupe::apps
