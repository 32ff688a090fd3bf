// Jinja's filters and tests, and the str/dict methods templates call, as jinja2 and Python define them, for the
// interpreter in data/jinja.h. The parser asks which names exist so a template that uses another one is refused
// when it is read, naming the filter and the line.
#pragma once
#include <string>
#include <vector>

#include "data/jinja_value.h"

namespace df::jinja {

bool jinja_filter_exists(const std::string& name);
bool jinja_test_exists(const std::string& name);

// `args` are the positional arguments after the value; `kwargs` name the trailing ones. Throws df::Error (the
// caller adds the template line) for a wrong type, as Python raises TypeError.
Value jinja_filter_apply(const std::string& name, const Value& v, const std::vector<Value>& args,
                         const std::vector<std::string>& kwargs);
bool jinja_test_apply(const std::string& name, const Value& v, const std::vector<Value>& args);
// obj.name(args) for str and dict methods; false when `obj` has no such method (the caller reports it).
bool jinja_method_call(const Value& obj, const std::string& name, const std::vector<Value>& args, Value* out);
// `a in b`, Python's containment (substring, list element, dict key).
bool jinja_contains(const Value& container, const Value& item);

}  // namespace df::jinja
