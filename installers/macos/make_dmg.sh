#!/usr/bin/env bash
# localchat.app -> a .dmg, signed and notarized when the secrets are in the environment:
#   MACOS_SIGN_IDENTITY   "Developer ID Application: ..." (a keychain identity)
#   MACOS_NOTARY_APPLE_ID, MACOS_NOTARY_TEAM_ID, MACOS_NOTARY_PASSWORD (an app-specific password)
# Without them the .dmg is unsigned: fine for testing, but macOS will call the app "damaged" on
# other machines (Gatekeeper), so releases must be signed.
set -euo pipefail
app="${1:?usage: make_dmg.sh path/to/localchat.app out.dmg}"
dmg="${2:?usage: make_dmg.sh path/to/localchat.app out.dmg}"
here="$(cd "$(dirname "$0")" && pwd)"

if [[ -n "${MACOS_SIGN_IDENTITY:-}" ]]; then
  # Hardened runtime (notarization requires it); the entitlements let PyTorch and Python load their
  # unsigned-by-Apple libraries.
  codesign --force --deep --timestamp --options runtime \
    --entitlements "$here/entitlements.plist" --sign "$MACOS_SIGN_IDENTITY" "$app"
  codesign --verify --strict --verbose=2 "$app"
else
  echo "MACOS_SIGN_IDENTITY is not set: the app is NOT signed" >&2
fi

staging="$(mktemp -d)"
cp -R "$app" "$staging/"
ln -s /Applications "$staging/Applications"
rm -f "$dmg"
hdiutil create -volname localchat -srcfolder "$staging" -ov -format UDZO "$dmg"
rm -rf "$staging"

if [[ -n "${MACOS_SIGN_IDENTITY:-}" ]]; then
  codesign --timestamp --sign "$MACOS_SIGN_IDENTITY" "$dmg"
fi
if [[ -n "${MACOS_NOTARY_APPLE_ID:-}" && -n "${MACOS_NOTARY_PASSWORD:-}" && -n "${MACOS_NOTARY_TEAM_ID:-}" ]]; then
  xcrun notarytool submit "$dmg" --wait --apple-id "$MACOS_NOTARY_APPLE_ID" \
    --team-id "$MACOS_NOTARY_TEAM_ID" --password "$MACOS_NOTARY_PASSWORD"
  xcrun stapler staple "$dmg"
else
  echo "notarization secrets are not set: the .dmg is NOT notarized" >&2
fi
ls -l "$dmg"
