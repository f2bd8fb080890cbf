// models/model_files.cpp: placeholder until the loader lands.
#include "models/model_files.h"
