// The stream inspector's pages (served same-origin under a strict CSP: no inline script, no eval). Content is only
// ever set as text, never parsed as HTML.
'use strict';
(function () {
  const body = document.body;
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function ms(v) { return v === null || v === undefined ? '' : v + ' ms'; }
  function counts(envelopes) {
    return Object.keys(envelopes || {}).map(function (k) { return k + ' ' + envelopes[k]; }).join(', ');
  }
  function summary(s) {
    return [s.state + (s.ended ? ' (' + s.ended + ')' : ''), s.path, 'dialect ' + (s.dialect || '?'),
      'encoder ' + s.encoder, 'in ' + s.bytes_in + ' B', 'out ' + s.bytes_out + ' B',
      'first upstream ' + ms(s.first_upstream_ms), 'first envelope ' + ms(s.first_envelope_ms),
      'parse errors ' + s.parse_errors, 'readers ' + (s.readers === null ? '-' : s.readers),
      'grace ' + (s.grace_secs_left === null ? '-' : s.grace_secs_left.toFixed(1) + ' s'),
      'agents ' + (s.agents || []).join(' '), counts(s.envelopes)].join(' · ');
  }
  function listPage() {
    const tbody = document.getElementById('streams');
    function refresh() {
      fetch('/debug/streams.json', { credentials: 'same-origin', cache: 'no-store' })
        .then(function (r) { return r.json(); })
        .then(function (j) {
          tbody.replaceChildren();
          j.streams.forEach(function (s) {
            const tr = el('tr');
            const a = el('a', null, s.id);
            a.href = '/debug/streams/' + encodeURIComponent(s.id);
            const id = el('td');
            id.append(a);
            tr.append(id, el('td', 'state-' + s.state, s.state), el('td', null, s.path),
              el('td', null, s.dialect || ''), el('td', null, s.encoder), el('td', null, counts(s.envelopes)),
              el('td', null, s.bytes_in + ' / ' + s.bytes_out), el('td', null, s.readers === null ? '-' : s.readers));
            tr.dataset.id = s.id;
            tbody.append(tr);
          });
          body.dataset.streams = String(j.streams.length);
        })
        .catch(function () { body.dataset.error = 'list'; });
    }
    refresh();
    setInterval(refresh, 2000);
  }
  function streamPage() {
    const id = decodeURIComponent(location.pathname.split('/').pop());
    document.getElementById('title').textContent = 'Stream ' + id;
    document.getElementById('capture').href = '/debug/streams/' + encodeURIComponent(id) + '/capture.ndjson';
    const raw = document.getElementById('raw');
    const env = document.getElementById('env');
    const sum = document.getElementById('summary');
    let nRaw = 0, nEnv = 0;
    function add(rec) {
      if (rec.side === 'raw') {
        const d = el('div', 'rec raw');
        d.id = 'raw-' + rec.seq;
        d.append(el('span', 'meta', '#' + rec.seq + ' +' + rec.t_ms + ' ms ' + rec.event + ' (' + rec.bytes + ' B) '));
        if (rec.data !== undefined) d.append(el('span', null, rec.data));
        raw.append(d);
        body.dataset.raw = String(++nRaw);
      } else if (rec.side === 'envelope') {
        const d = el('div', 'rec envelope');
        d.id = 'env-' + rec.seq;
        const from = rec.raw_seq === null ? el('span', 'meta', 'gateway') : el('a', 'meta', '← #' + rec.raw_seq);
        if (rec.raw_seq !== null) from.href = '#raw-' + rec.raw_seq;
        d.append(el('span', 'meta', '#' + rec.seq + ' +' + rec.t_ms + ' ms ' + rec.type + ' '), from, el('span', null, ' '));
        if (rec.data !== undefined) d.append(el('span', null, JSON.stringify(rec.data)));
        env.append(d);
        body.dataset.envelopes = String(++nEnv);
      } else if (rec.side === 'gap') {
        const text = rec.dropped + ' records no longer kept';
        raw.append(el('div', 'rec gap', text));
        env.append(el('div', 'rec gap', text));
      }
    }
    const feed = new EventSource('/debug/streams/' + encodeURIComponent(id) + '/events');
    feed.onmessage = function (e) { add(JSON.parse(e.data)); };
    feed.addEventListener('end', function () { feed.close(); body.dataset.ended = 'true'; refresh(); });
    feed.onerror = function () { if (feed.readyState === EventSource.CLOSED) body.dataset.feed = 'closed'; };
    function refresh() {
      fetch('/debug/streams.json', { credentials: 'same-origin', cache: 'no-store' })
        .then(function (r) { return r.json(); })
        .then(function (j) {
          const s = j.streams.find(function (x) { return x.id === id; });
          sum.textContent = s ? summary(s) : 'no longer listed';
        })
        .catch(function () { body.dataset.error = 'summary'; });
    }
    refresh();
    setInterval(function () { if (body.dataset.ended !== 'true') refresh(); }, 2000);
  }
  if (body.dataset.view === 'list') listPage();
  if (body.dataset.view === 'stream') streamPage();
})();
