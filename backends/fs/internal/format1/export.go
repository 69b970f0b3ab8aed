package format1

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// Export opens the format-1 store in dir as the build that wrote it would
// (replaying its journal and repairing its tree after a crash), returns
// every queue and every message, and closes it with a checkpoint, after
// which every body file is at queues/QUEUE/STATE/NAME of its message. The
// caller holds the store's lock. The store is left in format 1.
// maxID is the largest message ID or Seq the store was ever given.
func Export(ctx context.Context, dir string, log *slog.Logger) (_ []queuecore.QueueInfo, _ []queuecore.Message, maxID uint64, _ error) {
	s, err := open(ctx, dir, backends.Options{Sync: queuecore.SyncFull, Logger: log},
		config{checkpointBytes: defaultCheckpointBytes, stageAt: defaultStageAt, spares: -1, noLock: true})
	if err != nil {
		return nil, nil, 0, err
	}
	maxID, _ = s.MaxID(ctx)
	qs, msgs, err := exportAll(ctx, s)
	if cerr := s.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("read format-1 store %s: %w", dir, err)
	}
	return qs, msgs, maxID, nil
}

func exportAll(ctx context.Context, s *Store) ([]queuecore.QueueInfo, []queuecore.Message, error) {
	qs, err := s.Queues(ctx)
	if err != nil {
		return nil, nil, err
	}
	var msgs []queuecore.Message
	for _, q := range qs {
		for _, st := range queuecore.States {
			err := s.List(ctx, q.Name, st, func(m queuecore.Message) bool {
				msgs = append(msgs, m)
				return true
			})
			if err != nil {
				return nil, nil, err
			}
		}
	}
	return qs, msgs, nil
}
