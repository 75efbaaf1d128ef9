; Inno Setup script: the PyInstaller folder (build/dist/localchat) as a per-user Windows installer.
; installers/build.sh windows passes Version, SourceDir and OutputDir; signing happens in CI (signtool)
; when the certificate secrets exist.
#ifndef Version
  #define Version "0.1.0"
#endif
#ifndef SourceDir
  #define SourceDir "..\..\build\dist\localchat"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\build\installers"
#endif

[Setup]
AppId={{6F7C2B1E-3D0A-4B8E-9C51-2A7E5D4C9B10}
AppName=localchat
AppVersion={#Version}
AppPublisher=localchat developers
DefaultDirName={localappdata}\Programs\localchat
DefaultGroupName=localchat
PrivilegesRequired=lowest
OutputDir={#OutputDir}
OutputBaseFilename=localchat-{#Version}-setup
Compression=lzma2/max
SolidCompression=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
WizardStyle=modern
LicenseFile=..\licenses\NOTICE.md

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\localchat"; Filename: "{app}\localchat.exe"
Name: "{userdesktop}\localchat"; Filename: "{app}\localchat.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "Create a desktop shortcut"; Flags: unchecked

[Run]
Filename: "{app}\localchat.exe"; Description: "Start localchat"; Flags: nowait postinstall skipifsilent
