// The syntax tree of a Jinja template and the parser that builds it (data/jinja.h renders it) from the lexer's
// chunks (data/jinja_lex.h, which applies transformers' trim_blocks and lstrip_blocks). Anything outside the
// supported subset fails here, naming the construct and the template line, so an unsupported template never
// renders something else.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/jinja_value.h"

namespace df::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,    // value
    name,       // name
    list,       // items; op "tuple" for a tuple
    dict,       // keys[k]: items[k]
    attr,       // items[0].name
    index,      // items[0][items[1]]
    slice,      // items[0][items[1]:items[2]:items[3]] (null parts are absent)
    call,       // items[0](items[1..]); kwarg_names name the trailing keyword arguments
    filter,     // items[0] | name(items[1..], kwargs)
    test,       // items[0] is [not] name(items[1..]); negate
    unary,      // op items[0]: "not", "-", "+"
    binary,     // items[0] op items[1]: and or + - * / // % ** ~ == != < <= > >= in "not in"
    ternary,    // items[0] if items[1] else items[2] (items[2] null: undefined)
  };
  Kind kind = Kind::literal;
  int line = 0;
  Value value;
  std::string name, op;
  bool negate = false;
  std::vector<ExprPtr> items;
  std::vector<std::string> keys;        // dict literal keys
  std::vector<std::string> kwarg_names;  // call / filter: names of the last kwarg_names.size() items
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // defaults for the last defaults.size() params
  Body body;
};

struct Stmt {
  enum class Kind { text, output, if_, for_, set, set_block, macro, break_, continue_, generation };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;                    // text
  ExprPtr expr;                        // output, set value, for iterable
  std::vector<ExprPtr> conds;          // if: one per branch, null for else
  std::vector<Body> branches;          // if branches; for: [body, else body]
  std::vector<std::string> targets;    // for / set names (several: unpacking)
  std::string target_attr;             // set ns.attr: targets[0] is ns, this the attribute
  ExprPtr filter;                      // for ... if filter
  std::unique_ptr<MacroDef> macro;
};

// Parses `source` (`name` is the file the errors name). Throws df::Error for syntax errors and for constructs
// outside the subset: include/import/extends/block/call/with/raw/filter blocks, recursive loops, unknown filters
// and tests.
Body jinja_parse(const std::string& source, const std::string& name);

}  // namespace df::jinja
