#!/usr/bin/zsh -f
# SPDX-License-Identifier: MIT
# Print, one a line, what zsh's completion offers for the command line "$2" (completed at its end),
# with fpath led by $1: an interactive zsh in a zpty runs compinit and a TAB, with compadd wrapped
# to print every match it is given (after Valodim's zsh-capture-completion). Exit 2: no answer.
zmodload zsh/zpty || exit 2
FPATH_DIR=$1
LINE=$2
HOME=$(mktemp -d) || exit 2
trap 'rm -rf -- $HOME' EXIT
cat > $HOME/init.zsh <<'INIT'
PROMPT=
fpath=($FPATH_DIR $fpath)
autoload -Uz compinit
compinit -u -d $HOME/.zcompdump
bindkey '^M' undefined
bindkey '^J' undefined
bindkey '^I' complete-word
null-line() { echo -E - $'\0' }
compprefuncs=(null-line)
comppostfuncs=(null-line exit)
zstyle ':completion:*' list-grouped false
zstyle ':completion:*' insert-tab false
zstyle ':completion:*' list-separator ''
compadd() {
  # Calls that only fill arrays (-O, -A, -D) pass through unseen.
  if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then
    builtin compadd "$@"
    return $?
  fi
  typeset -a __hits
  builtin compadd -A __hits "$@"
  local h
  for h in $__hits; do
    echo -E - "HIT:$h"
  done
}
echo INIT-DONE
INIT
zpty z FPATH_DIR=$FPATH_DIR HOME=$HOME zsh -f -i
zpty -w z "source $HOME/init.zsh"
# Wait for init.zsh's INIT-DONE: a line typed before compinit ran would complete nothing.
local out
zpty -r z out '*INIT-DONE*' || exit 2
zpty -w z "$LINE"$'\t'
integer tog=0
local l
while zpty -r z l; do
  l=${l%$'\r'}
  l=${l%$'\n'}
  l=${l%$'\r'}
  if [[ $l == *$'\0'* ]]; then
    (( tog++ )) && break || continue
  fi
  (( tog )) && [[ $l == HIT:* ]] && print -r -- ${l#HIT:}
done
zpty -d z
(( tog )) || exit 2
exit 0
