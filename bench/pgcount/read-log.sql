SELECT count(*), sum(length(payload)) FROM (SELECT * FROM logt WHERE seq > (SELECT min(pos) FROM pos) ORDER BY seq LIMIT 256) s;
