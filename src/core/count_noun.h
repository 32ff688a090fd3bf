// A count with its noun in agreement, for messages and start-up lines ("1 drafter", "2 drafters").
#pragma once
#include <string>

namespace df {

// "1 drafter", "2 drafters", "0 drafters": the plural is `many`, by default `one` + "s".
std::string count_noun(long long n, const char* one, const char* many = nullptr);

}  // namespace df
