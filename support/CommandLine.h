// Every Loom binary parses its flags with llvm::cl (--name value, --name=value, switches
// without a value, the last occurrence wins). Each tool puts its options in its own
// cl::OptionCategory with a description each and calls parseCommandLine() first thing in main:
//   if (!loom::parseCommandLine(argc, argv, kOverview, {&category})) return 2;
// Header-only: the binary links llvm::cl itself, through @llvm//:support (the static
// libLLVMSupport.a: the runtime binaries, which must not need libLLVM-19.so) or, for the
// binaries that link MLIR, through @llvm//:mlir -- never both (two option registries abort at
// start-up).
#pragma once

#include <string>

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

namespace loom {

// Hides every option outside `categories` (so --help lists the tool's own flags, besides
// llvm::cl's --help, --help-list and --version) and parses the command line. --help prints the
// overview and the flags on stdout and exits 0. A bad command line (an unknown flag, a missing
// or malformed value, a stray argument) is reported in one line on stderr and the function
// returns false: the tool then exits 2.
inline bool parseCommandLine(int argc, const char *const *argv, llvm::StringRef overview,
                             llvm::ArrayRef<const llvm::cl::OptionCategory *> categories) {
  llvm::cl::HideUnrelatedOptions(categories);
  std::string prefix = (llvm::sys::path::filename(argc > 0 ? argv[0] : "") + ": ").str();
  // -h is --help, as in torchrun and Megatron-LM's argparse. Nothing else starting with h is:
  // llvm::cl makes its one-letter alias "h" a grouping option, so that "--hello" or "--html"
  // would be "-h" plus letters and print the help (exit 0); a flag starting with h that no
  // subcommand registers is refused here, as any unknown flag is.
  llvm::SmallVector<const char *, 16> args(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef a(args[size_t(i)]);
    if (a == "--") break;
    if (a == "-h") {
      args[size_t(i)] = "--help";
      continue;
    }
    if (!a.starts_with("-")) continue;
    llvm::StringRef name = a.ltrim('-').split('=').first;
    if (!name.starts_with("h")) continue;
    bool known = false;
    for (llvm::cl::SubCommand *sub : llvm::cl::getRegisteredSubcommands())
      known |= llvm::cl::getRegisteredOptions(*sub).count(name) > 0;
    if (!known) {
      llvm::errs() << prefix << "Unknown command line argument '" << a << "'.  Try: '"
                   << llvm::sys::path::filename(argv[0]) << " --help'\n";
      return false;
    }
  }
  std::string errors;
  llvm::raw_string_ostream os(errors);
  bool ok = llvm::cl::ParseCommandLineOptions(argc, args.data(), overview, &os);
  os.flush();
  if (ok) return true;
  // A malformed value llvm::cl reports on stderr itself, in one line ("TOOL: for the --lr
  // option: 'x' value invalid for floating point argument!"). The rest arrives here, as one
  // line per problem plus continuation lines: the first problem is kept, with its continuation
  // and llvm::cl's "Did you mean '--steps'?", as one line; errors that follow from it (the value
  // of an unknown flag taken for a stray argument) are dropped.
  llvm::SmallVector<llvm::StringRef, 8> lines;
  llvm::StringRef(errors).split(lines, '\n', -1, /*KeepEmpty=*/false);
  std::string line;
  for (llvm::StringRef l : lines) {
    if (line.empty()) {
      line = l.str();
    } else if (l.consume_front(prefix)) {
      if (l.starts_with("Did you mean")) line += " " + l.str();
      else break;
    } else {
      line += " " + l.str();
    }
  }
  if (!line.empty()) llvm::errs() << line << "\n";
  return false;
}

}  // namespace loom
