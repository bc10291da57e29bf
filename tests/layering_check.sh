#!/usr/bin/env bash
# The layering of STYLE.md as include rules: each folder names what it must never include.
# Usage: layering_check.sh [ROOT]        checks the tree at ROOT (default: this checkout)
#        layering_check.sh --self-test   plants one violation per rule in a copy; each must fail
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"

check() {  # check ROOT: prints every violation; non-zero if any
  local root=$1 fail=0
  forbid() {  # forbid FOLDER REGEX WHAT
    local hits
    hits=$(cd "$root" && grep -rnE "#include [<\"]($2)" "$1" --include='*.h' --include='*.cc')
    if [ -n "$hits" ]; then
      printf 'layering: %s/ must not include %s:\n%s\n' "$1" "$3" "$hits"
      fail=1
    fi
  }
  forbid server/batching 'torch/|ATen/|c10/|grpcpp/|grpc/|prometheus/' 'torch, gRPC or prometheus'
  forbid model 'grpcpp/|grpc/|praxis/v1/|server/|client/' 'gRPC, the protocol, the server or clients'
  forbid wire 'model/|server/|client/|grpcpp/|grpc/' 'the model, the server, the clients or gRPC'
  forbid client 'server/|model/' 'the server or the model (only wire/ and the protocol)'
  # The model may use the half of wire/ without protobuf (praxis_step_files), not the codec.
  local proto_wire
  proto_wire=$(cd "$root" && grep -lE '#include "praxis/v1/' wire/*.h | sed 's/\./\\./g' | paste -sd'|')
  [ -z "$proto_wire" ] || forbid model "($proto_wire)" 'wire/ headers that use the protocol'
  return $fail
}

if [ "${1:-}" != --self-test ]; then
  check "${1:-$here}" && echo "layering: ok"
  exit
fi
# Each planted include must be caught, and the clean copy must pass.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for plant in 'client/praxis_client.cc:server/server.h' 'client/load_mix.cc:model/config.h' \
             'model/towers.cc:praxis/v1/praxis.pb.h' 'model/backbone.cc:wire/tensor_codec.h' \
             'wire/synthetic.cc:model/config.h' 'server/batching/batcher.cc:torch/types.h'; do
  file=${plant%%:*} header=${plant#*:}
  rm -rf "$tmp/tree" && mkdir "$tmp/tree"
  (cd "$here" && cp -r --parents server model wire client "$tmp/tree")
  echo "#include \"$header\"" >>"$tmp/tree/$file"
  if check "$tmp/tree" >/dev/null; then
    echo "layering self-test: '#include \"$header\"' in $file was not caught"
    status=1
  else
    echo "layering self-test: '#include \"$header\"' in $file caught"
  fi
done
rm -rf "$tmp/tree" && mkdir "$tmp/tree" && (cd "$here" && cp -r --parents server model wire client "$tmp/tree")
check "$tmp/tree" >/dev/null || { echo "layering self-test: the clean copy failed"; status=1; }
exit $status
