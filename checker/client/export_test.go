package client

// PendingChecks is how many checks wait to be sent in a batch; 0 without coalescing.
func (c *Client) PendingChecks() int {
	if c.batch == nil {
		return 0
	}
	c.batch.mu.Lock()
	defer c.batch.mu.Unlock()
	return len(c.batch.pending)
}
