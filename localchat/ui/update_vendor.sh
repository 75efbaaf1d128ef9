#!/usr/bin/env bash
# Re-fetch the vendored libraries into static/vendor/ from the npm registry (see static/vendor/VERSIONS.md).
# Needs npm; run from anywhere. It lives outside static/ so the server never serves it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)/static/vendor"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fetch() {  # fetch PACKAGE@VERSION FOLDER FILE-IN-PACKAGE LICENCE-FILES...
  local spec=$1 folder=$2 file=$3
  shift 3
  (cd "$tmp" && rm -rf package && tar xzf "$(npm pack -q "$spec")")
  mkdir -p "$here/$folder"
  cp "$tmp/package/$file" "$here/$folder/"
  for licence in "$@"; do cp "$tmp/package/$licence" "$here/$folder/"; done
}
fetch htmx.org@2.0.11 htmx dist/htmx.min.js LICENSE
fetch htmx-ext-sse@2.2.4 htmx-ext-sse sse.js LICENSE
fetch marked@18.2.1 marked lib/marked.umd.js LICENSE
fetch dompurify@3.4.18 dompurify dist/purify.min.js LICENSE LICENSE-MPL
fetch @highlightjs/cdn-assets@11.12.0 highlightjs highlight.min.js LICENSE
(cd "$here" && sha256sum ./*/*.js)
