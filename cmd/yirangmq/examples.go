package main

import (
	"fmt"
	"io"
	"strings"
)

// examples end each command's --help (and so docs/cli.md): two or three
// command lines a newcomer can run as they are, on the mountpoint the
// client commands use by default ($YIRANGMQ_MOUNT, else /mnt/mq).
var examples = map[string][]string{
	"mount": {
		"sudo mkdir -p /mnt/mq && sudo yirangmq mount --daemon /mnt/mq          # SQLite store in /var/lib/yirangmq",
		"sudo yirangmq mount --backend fs --store /srv/queues -o allow_other /mnt/mq   # foreground; Ctrl-C unmounts",
		"sudo yirangmq mount --daemon --memory-budget 48MiB --sync normal /mnt/mq",
	},
	"umount": {
		"sudo yirangmq umount /mnt/mq          # returns once the daemon has exited",
		"sudo yirangmq umount --lazy /mnt/mq   # detach now, the daemon stops when the last user leaves",
	},
	"publish": {
		"echo '{\"order\": 42}' | yirangmq publish --queue jobs",
		"yirangmq publish --queue jobs --json orders/*.json",
		"yirangmq publish --mount /srv/mq --queue jobs --name order-42 --file order.json",
	},
	"consume": {
		"yirangmq consume --queue jobs -- ./handle-order.sh          # body on stdin, $YIRANGMQ_MESSAGE its path",
		"yirangmq consume --queue jobs --concurrency 4 -- python3 worker.py",
		"yirangmq consume --queue jobs --drain -v -- sh -c 'jq . >> done.log'",
	},
	"status": {
		"yirangmq status",
		"yirangmq status --queue jobs --json",
		"yirangmq status --watch --interval 2s",
	},
	"dlq": {
		"yirangmq dlq list --queue jobs",
		"yirangmq dlq requeue --queue jobs --filter reasonCode=HANDLER_FAILED",
		"yirangmq dlq purge --queue jobs --older-than 168h",
	},
	"pause": {
		"yirangmq pause --queue jobs",
		"YIRANGMQ_MOUNT=/srv/mq yirangmq pause --queue jobs",
	},
	"resume": {
		"yirangmq resume --queue jobs",
		"YIRANGMQ_MOUNT=/srv/mq yirangmq resume --queue jobs",
	},
	"drain": {
		"yirangmq drain --queue jobs",
		"yirangmq pause --queue jobs && yirangmq drain --queue jobs --timeout 10m   # before an upgrade",
	},
	"announce": {
		"yirangmq announce --queue jobs &",
		"yirangmq announce --queue jobs --interval 200ms",
	},
	"version": {
		"yirangmq version",
		"yirangmq --version",
	},
	"reference": {
		"yirangmq reference > docs/cli.md",
		"yirangmq reference | less",
	},
}

// printExamples ends a command's --help.
func printExamples(w io.Writer, command string) {
	ex := examples[command]
	if len(ex) == 0 {
		return
	}
	fmt.Fprintf(w, "\nExamples:\n  %s\n", strings.Join(ex, "\n  "))
}
